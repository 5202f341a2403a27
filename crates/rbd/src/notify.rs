//! RADOS watch/notify: what a watcher receives and what a notifier gets back.

/// One notification delivered to a watch callback ([`Ioctx::watch`](crate::Ioctx)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// The id of this notification (what the acknowledgement refers to).
    pub notify_id: u64,
    /// The watch's cookie (handle), as returned by `Watch::cookie`.
    pub cookie: u64,
    /// The notifier's global id (its `rados_get_instance_id`, i.e. `client.<id>`).
    pub notifier_id: u64,
    /// The notifier's payload.
    pub payload: Vec<u8>,
}

/// A watcher that acknowledged a notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyAck {
    /// The watcher's global id (`client.<gid>`).
    pub gid: u64,
    /// The watch's cookie.
    pub cookie: u64,
    /// The payload the watcher acknowledged with (may be empty).
    pub payload: Vec<u8>,
}

/// A watcher that did not acknowledge a notification in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyTimeout {
    /// The watcher's global id.
    pub gid: u64,
    /// The watch's cookie.
    pub cookie: u64,
}

/// Everything a notification got back: acknowledgements and watchers that timed out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyReplies {
    /// Watchers that acknowledged, with their payloads.
    pub acks: Vec<NotifyAck>,
    /// Watchers that did not acknowledge before the timeout.
    pub timeouts: Vec<NotifyTimeout>,
}

impl NotifyReplies {
    /// Parses the reply buffer of `rados_notify2` (layout documented in librados.h):
    /// `le32 num_acks; { le64 gid; le64 cookie; le32 len; u8[len] } * num_acks;
    /// le32 num_timeouts; { le64 gid; le64 cookie } * num_timeouts`.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let mut r = Reader(buf);
        let n_acks = r.u32()?;
        let mut acks = Vec::with_capacity((n_acks as usize).min(buf.len() / 20));
        for _ in 0..n_acks {
            let gid = r.u64()?;
            let cookie = r.u64()?;
            let len = r.u32()? as usize;
            let payload = r.take(len)?.to_vec();
            acks.push(NotifyAck { gid, cookie, payload });
        }
        let n_timeouts = r.u32()?;
        let mut timeouts = Vec::with_capacity((n_timeouts as usize).min(buf.len() / 16));
        for _ in 0..n_timeouts {
            timeouts.push(NotifyTimeout { gid: r.u64()?, cookie: r.u64()? });
        }
        Some(Self { acks, timeouts })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(r: &NotifyReplies) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(r.acks.len() as u32).to_le_bytes());
        for a in &r.acks {
            b.extend_from_slice(&a.gid.to_le_bytes());
            b.extend_from_slice(&a.cookie.to_le_bytes());
            b.extend_from_slice(&(a.payload.len() as u32).to_le_bytes());
            b.extend_from_slice(&a.payload);
        }
        b.extend_from_slice(&(r.timeouts.len() as u32).to_le_bytes());
        for t in &r.timeouts {
            b.extend_from_slice(&t.gid.to_le_bytes());
            b.extend_from_slice(&t.cookie.to_le_bytes());
        }
        b
    }

    #[test]
    fn round_trip() {
        let r = NotifyReplies {
            acks: vec![
                NotifyAck { gid: 4123, cookie: 94_000_000_001, payload: b"pong".to_vec() },
                NotifyAck { gid: 4124, cookie: 2, payload: vec![] },
            ],
            timeouts: vec![NotifyTimeout { gid: 4125, cookie: 3 }],
        };
        let b = encode(&r);
        assert_eq!(NotifyReplies::parse(&b), Some(r));
        assert_eq!(NotifyReplies::parse(&[0; 8]), Some(NotifyReplies::default()));
    }

    #[test]
    fn truncated_is_refused() {
        let r = NotifyReplies {
            acks: vec![NotifyAck { gid: 1, cookie: 2, payload: b"abc".to_vec() }],
            timeouts: vec![NotifyTimeout { gid: 3, cookie: 4 }],
        };
        let b = encode(&r);
        for cut in 0..b.len() {
            assert_eq!(NotifyReplies::parse(&b[..cut]), None, "cut at {cut}");
        }
        // A huge count with no data behind it neither panics nor allocates wildly.
        assert_eq!(NotifyReplies::parse(&u32::MAX.to_le_bytes()), None);
    }
}
