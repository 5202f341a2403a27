//! The target's count of PDUs it sends unasked, which land in the initiator's few spare
//! receives.

use riser_datamover::{DmError, Violation};
use riser_iscsi::wire::{Header, RESERVED_TAG};

/// PDUs the target sends unasked (a NOP-In ping, an Async Message) land in the initiator's few
/// spare receives: Linux's iSER initiator sizes for two of each (ISER_MAX_RX_MISC_PDUS). The
/// target never has more than that in flight; a ping stops counting when its NOP-Out answer
/// arrives, an Async Message never does (riser's target core sends none today).
#[derive(Debug, Default)]
pub(super) struct Unexpected {
    pings: Vec<u32>,
    asyncs: u8,
}

/// Unexpected PDUs of each kind the initiator can take.
const MAX_UNEXPECTED: usize = 2;

impl Unexpected {
    /// Account for an outgoing PDU; an error if the initiator could not receive it.
    pub(super) fn sending(&mut self, h: &Header) -> Result<(), DmError> {
        match h {
            Header::NopIn(n) if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG => {
                if self.pings.len() >= MAX_UNEXPECTED {
                    return Err(Violation::TooManyUnexpected { limit: MAX_UNEXPECTED as u32 }.into());
                }
                self.pings.push(n.ttt);
            }
            Header::AsyncMessage(_) => {
                if usize::from(self.asyncs) >= MAX_UNEXPECTED {
                    return Err(Violation::TooManyUnexpected { limit: MAX_UNEXPECTED as u32 }.into());
                }
                self.asyncs += 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// Account for a received PDU: a NOP-Out answering a ping frees its receive.
    pub(super) fn received(&mut self, h: &Header) {
        if let Header::NopOut(n) = h
            && n.ttt != RESERVED_TAG
        {
            self.pings.retain(|&t| t != n.ttt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::wire::{AsyncMessage, NopIn, NopOut};

    fn ping(ttt: u32) -> Header {
        Header::NopIn(NopIn { itt: RESERVED_TAG, ttt, ..NopIn::default() })
    }

    #[test]
    fn at_most_two_unanswered_pings_and_two_async_messages() {
        let mut u = Unexpected::default();
        u.sending(&ping(1)).unwrap();
        u.sending(&ping(2)).unwrap();
        assert_eq!(u.sending(&ping(3)), Err(Violation::TooManyUnexpected { limit: 2 }.into()));
        // A NOP-In answering the initiator's NOP-Out is expected: not counted.
        u.sending(&Header::NopIn(NopIn { itt: 7, ttt: RESERVED_TAG, ..NopIn::default() })).unwrap();
        // An answer to an unknown ping frees nothing; the answer to ping 1 frees one.
        u.received(&Header::NopOut(NopOut { itt: 9, ttt: 5, ..NopOut::default() }));
        assert!(u.sending(&ping(3)).is_err());
        u.received(&Header::NopOut(NopOut { itt: 9, ttt: 1, ..NopOut::default() }));
        u.sending(&ping(3)).unwrap();
        let asyncm = Header::AsyncMessage(AsyncMessage::default());
        u.sending(&asyncm).unwrap();
        u.sending(&asyncm).unwrap();
        assert!(u.sending(&asyncm).is_err());
    }
}
