//! Reservations: PERSISTENT RESERVE IN/OUT, RESERVE/RELEASE (6/10), and the reservation
//! conflict check every command passes before it runs.

use super::pr_store::{Pr, PrStore};
use super::{Fast, LogicalUnit, Nexus, Outcome, R, bad_field, illegal, truncate};
use bytes::Bytes;
use riser_scsi::cdb::Cdb;
use riser_scsi::sense::{AscAscq, Sense, Status};
use std::path::PathBuf;
use std::sync::Arc;

fn all_registrants(t: u8) -> bool {
    matches!(t, riser_scsi::pr::pr_type::WRITE_EXCLUSIVE_ALL_REGISTRANTS | riser_scsi::pr::pr_type::EXCLUSIVE_ACCESS_ALL_REGISTRANTS)
}

impl LogicalUnit {
    /// Keep this unit's persistent reservations in the file at `path` while an application
    /// client has activated persist through power loss (PERSISTENT RESERVE OUT with APTPL=1,
    /// SPC-5 §5.14.5), so they survive a restart of the target. The unit then reports PTPL_C in
    /// REPORT CAPABILITIES and honours APTPL; without a file it refuses APTPL=1.
    ///
    /// If the file exists, the unit starts with the registrations (their I_T nexuses and keys)
    /// and the reservation it holds, with APTPL active. A file that cannot be read, or is not
    /// a valid persistent reservation file, is an error naming the path (InvalidData when
    /// malformed): the unit never starts with registrations silently dropped. A missing file
    /// is no state.
    ///
    /// The directory is the caller's (a service's state directory, one file per unit); the
    /// unit creates, replaces and removes only the file (and a temporary `.NAME.tmp` beside it
    /// while it writes). Every PERSISTENT RESERVE OUT that changes the state while APTPL is
    /// active rewrites the file atomically and durably before it returns GOOD; one that turns
    /// APTPL off removes it.
    pub fn with_persistent_reservation_file(mut self, path: PathBuf) -> std::io::Result<Self> {
        let store = PrStore::new(path)?;
        if let Some(pr) = store.load()? {
            tracing::info!(
                unit = %self.identity,
                file = %store.path().display(),
                registrations = pr.registrations.len(),
                reserved = pr.holder.is_some(),
                "persistent reservations restored (APTPL)"
            );
            self.state.get_mut().unwrap_or_else(|e| e.into_inner()).pr = pr;
        }
        self.pr_store = Some(store);
        Ok(self)
    }

    pub(super) fn reservation_conflict(&self, c: &Cdb, nexus: &Nexus) -> Option<Outcome> {
        if self.fast() & Fast::QUIET != 0 {
            // No reservation is held.
            return None;
        }
        let s = self.st();
        let allowed_always = matches!(
            c,
            Cdb::Inquiry { .. }
                | Cdb::ReportLuns { .. }
                | Cdb::RequestSense { .. }
                | Cdb::PersistentReserveIn { .. }
                | Cdb::PersistentReserveOut { .. }
                | Cdb::ReadCapacity10 { .. }
                | Cdb::ReadCapacity16 { .. }
                | Cdb::Release6 { .. }
                | Cdb::Release10 { .. }
        );
        if let Some(holder) = &s.reserved_by
            && holder != nexus.key()
            && !allowed_always
        {
            return Some(Outcome::conflict());
        }
        if let Some((holder, _, ty)) = &s.pr.holder
            && holder != nexus
            && !allowed_always
        {
            let registered = s.pr.registrations.iter().any(|(n, _)| n == nexus);
            let is_write = matches!(
                c,
                Cdb::Write(_)
                    | Cdb::WriteAndVerify(_)
                    | Cdb::WriteSame(_)
                    | Cdb::Unmap { .. }
                    | Cdb::CompareAndWrite { .. }
                    | Cdb::SynchronizeCache(_)
                    | Cdb::ModeSelect(_)
                    | Cdb::Reserve6 { .. }
                    | Cdb::Reserve10 { .. }
                    | Cdb::OrWrite(_)
                    | Cdb::WriteAtomic { .. }
                    | Cdb::Sanitize { .. }
            );
            use riser_scsi::pr::pr_type::*;
            let conflict = match *ty {
                WRITE_EXCLUSIVE => is_write,
                EXCLUSIVE_ACCESS => true,
                WRITE_EXCLUSIVE_REGISTRANTS_ONLY | WRITE_EXCLUSIVE_ALL_REGISTRANTS => is_write && !registered,
                EXCLUSIVE_ACCESS_REGISTRANTS_ONLY | EXCLUSIVE_ACCESS_ALL_REGISTRANTS => !registered,
                _ => false,
            };
            if conflict {
                return Some(Outcome::conflict());
            }
        }
        None
    }

    /// RESERVE (6/10): reserve the LU for `nexus`, unless another nexus holds it.
    pub(super) fn reserve(&self, nexus: &Nexus) -> Outcome {
        let mut s = self.st();
        match &s.reserved_by {
            Some(h) if h != nexus.key() => Outcome::conflict(),
            _ => {
                s.reserved_by = Some(nexus.key().into());
                Outcome::good(Bytes::new())
            }
        }
    }

    /// RELEASE (6/10): drop `nexus`'s reservation, if it holds one.
    pub(super) fn release(&self, nexus: &Nexus) -> Outcome {
        let mut s = self.st();
        if s.reserved_by.as_deref() == Some(nexus.key()) {
            s.reserved_by = None;
        }
        Outcome::good(Bytes::new())
    }

    pub(super) fn pr_in(&self, sa: u8, alloc: u16) -> R {
        use riser_scsi::pr::*;
        let s = self.st();
        let data = match sa {
            in_sa::READ_KEYS => read_keys_to_bytes(s.pr.generation, &s.pr.registrations.iter().map(|(_, k)| *k).collect::<Vec<_>>()),
            in_sa::READ_RESERVATION => read_reservation_to_bytes(
                s.pr.generation,
                // All-registrants reservations report key 0 (SPC-5 §6.16.3).
                s.pr.holder.as_ref().map(|(_, k, t)| Reservation { key: if all_registrants(*t) { 0 } else { *k }, scope: 0, pr_type: *t }),
            ),
            in_sa::READ_FULL_STATUS => self.full_status(&s.pr),
            in_sa::REPORT_CAPABILITIES => {
                // CRH and TMV as ever; PTPL_C with a file to persist to, PTPL_A while APTPL is on.
                let ptpl_c = if self.pr_store.is_some() || self.shared_pr.get().is_some() { caps::BYTE2_PTPL_C } else { 0 };
                let ptpl_a = if s.pr.aptpl { caps::BYTE3_PTPL_A } else { 0 };
                report_capabilities_to_bytes(caps::BYTE2_CRH | ptpl_c, caps::BYTE3_TMV | ptpl_a, 0xea01).to_vec()
            }
            _ => return Err(bad_field(1, Some(4))),
        };
        Ok(Outcome::good(truncate(data, u32::from(alloc))))
    }

    fn full_status(&self, pr: &Pr) -> Vec<u8> {
        let mut body = Vec::new();
        for (n, k) in &pr.registrations {
            let holder = pr.holder.as_ref().filter(|(h, _, t)| h == n || all_registrants(*t));
            // iSCSI TransportID, format 00b: the initiator name, NUL-terminated, padded to 4.
            let name = n.initiator_name();
            let mut tid = vec![0x05, 0, 0, 0];
            tid.extend_from_slice(name.as_bytes());
            tid.push(0);
            tid.resize(tid.len().div_ceil(4) * 4, 0);
            let l = (tid.len() - 4) as u16;
            tid[2..4].copy_from_slice(&l.to_be_bytes());
            let mut d = [0u8; 24];
            d[0..8].copy_from_slice(&k.to_be_bytes());
            if let Some((_, _, t)) = holder {
                d[12] = 0x01;
                d[13] = *t;
            }
            d[18..20].copy_from_slice(&n.relative_port().to_be_bytes());
            d[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
            body.extend_from_slice(&d);
            body.extend_from_slice(&tid);
        }
        let mut v = Vec::with_capacity(8 + body.len());
        v.extend_from_slice(&pr.generation.to_be_bytes());
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }

    pub(super) fn pr_out(&self, sa: u8, scope: u8, ty: u8, out: &[u8], nexus: &Nexus) -> R {
        use riser_scsi::pr::*;
        let p = PrOutParams::parse(out).map_err(|e| e.sense(false))?;
        if out.len() != 24 && !p.spec_i_pt {
            return Err(illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR));
        }
        // APTPL=1 needs a file to persist to (PTPL_C=0 without one), or the cluster.
        if p.spec_i_pt || (p.aptpl && self.pr_store.is_none() && self.shared_pr.get().is_none()) {
            return Err(Sense::invalid_field_in_parameter_list(20, None));
        }
        if let Some(shared) = self.shared_pr.get() {
            return self.pr_out_shared(shared.as_ref(), sa, scope, ty, &p, nexus);
        }
        // Every service action works on a copy that replaces the state only once the command
        // has succeeded (and, with APTPL active, the file holds it).
        let Some(store) = &self.pr_store else {
            let mut s = self.st();
            let mut next = s.pr.clone();
            let o = next.apply(sa, scope, ty, &p, nexus)?;
            if o.status == Status::GOOD {
                s.pr = next;
            }
            return Ok(o);
        };
        // PR OUT commands take turns here, so the state read below stays current until it is
        // replaced, while other commands go on (the state lock is not held across the write).
        let _turn = store.serialize();
        let now = self.st().pr.clone();
        let mut next = now.clone();
        let o = next.apply(sa, scope, ty, &p, nexus)?;
        if o.status != Status::GOOD {
            return Ok(o);
        }
        // APTPL counts on REGISTER and REGISTER AND IGNORE EXISTING KEY only (other service
        // actions ignore the bit), and the most recent valid value governs (SPC-5 §5.14.5).
        if matches!(sa, out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE_EXISTING_KEY) {
            next.aptpl = p.aptpl;
        }
        if next != now {
            let kept = if next.aptpl {
                store.save(&next)
            } else if now.aptpl {
                // APTPL off: from now on the state lives in memory only.
                store.remove()
            } else {
                Ok(())
            };
            if let Err(e) = kept {
                tracing::error!(
                    unit = %self.identity,
                    file = %store.path().display(),
                    "cannot keep the persistent reservations, PERSISTENT RESERVE OUT refused: {e}"
                );
                // SPC-5 §6.17.1: a PERSISTENT RESERVE OUT the device server has not the
                // resources to complete ends with ILLEGAL REQUEST, INSUFFICIENT REGISTRATION
                // RESOURCES; nonvolatile storage for APTPL is such a resource. The state is as
                // before the command, so the client may retry it; HARDWARE ERROR would call
                // the unit broken when only its reservation file is.
                return Err(illegal(AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES));
            }
        }
        self.st().pr = next;
        Ok(o)
    }
}

impl LogicalUnit {
    /// PERSISTENT RESERVE OUT on a unit whose reservations the gateways of its store share: under
    /// the cluster-wide turn, on the state read fresh from the cluster, published to every
    /// gateway before GOOD.
    fn pr_out_shared(
        &self,
        shared: &dyn super::SharedReservations,
        sa: u8,
        scope: u8,
        ty: u8,
        p: &riser_scsi::pr::PrOutParams,
        nexus: &Nexus,
    ) -> R {
        use riser_scsi::pr::out_sa;
        let mut result: Option<R> = None;
        let mut committed: Option<Pr> = None;
        let done = shared.update(&mut |text| {
            let now = match text.map(super::pr_store::from_shared_text) {
                None => Pr::default(),
                Some(Ok(pr)) => pr,
                Some(Err(e)) => {
                    tracing::error!(unit = %self.identity, "the shared persistent reservation state is malformed: {e}");
                    result = Some(Err(illegal(AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES)));
                    return None;
                }
            };
            let mut next = now.clone();
            let r = next.apply(sa, scope, ty, p, nexus);
            if matches!(&r, Ok(o) if o.status == Status::GOOD) && matches!(sa, out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE_EXISTING_KEY)
            {
                next.aptpl = p.aptpl;
            }
            let changed = matches!(&r, Ok(o) if o.status == Status::GOOD) && next != now;
            self.st().pr = now;
            result = Some(r);
            changed.then(|| {
                let text = super::pr_store::to_shared_text(&next);
                committed = Some(next);
                text
            })
        });
        if let Err(e) = done {
            tracing::error!(unit = %self.identity, "cannot keep the persistent reservations in the cluster, PERSISTENT RESERVE OUT refused: {e}");
            return Err(illegal(AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES));
        }
        if let Some(next) = committed {
            self.st().pr = next;
        }
        result.unwrap_or_else(|| Err(illegal(AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES)))
    }

    /// The reservation state the gateways of the unit's store share, as another gateway
    /// changed it (`None`: there is none yet): it replaces the unit's.
    pub fn load_shared_reservations(&self, text: Option<&str>) -> Result<(), String> {
        let pr = match text {
            Some(t) => super::pr_store::from_shared_text(t)?,
            None => Pr::default(),
        };
        self.st().pr = pr;
        Ok(())
    }

    /// Keep the unit's persistent reservations in `shared` (the cluster the store lives in), so
    /// that every gateway exporting the store sees one reservation state; APTPL is then
    /// honoured by the cluster. Set once; false if already set.
    pub fn set_shared_reservations(&self, shared: Arc<dyn super::SharedReservations>) -> bool {
        self.shared_pr.set(shared).is_ok()
    }

    /// The state as the gateways share it (its text), for a gateway that starts.
    pub fn shared_reservations_text(&self) -> String {
        super::pr_store::to_shared_text(&self.st().pr)
    }
}

/// Registrations a unit keeps at most (I_T nexuses with a reservation key): a REGISTER of one
/// more is answered ILLEGAL REQUEST, INSUFFICIENT REGISTRATION RESOURCES (SPC-5 §6.17.1).
/// 1024: every initiator of a large cluster through a few paths each; each one is written to
/// the reservation file (APTPL) or the shared state with every change and listed by READ FULL
/// STATUS.
pub const MAX_REGISTRATIONS: usize = 1024;

impl Pr {
    /// Carry out one PERSISTENT RESERVE OUT service action on this state (APTPL aside). On
    /// RESERVATION CONFLICT or an error the state may be half changed: callers work on a copy.
    fn apply(&mut self, sa: u8, scope: u8, ty: u8, p: &riser_scsi::pr::PrOutParams, nexus: &Nexus) -> R {
        use riser_scsi::pr::*;
        let mine = self.registrations.iter().position(|(n, _)| n == nexus);
        let my_key = mine.map(|i| self.registrations[i].1);
        let valid_type = |t: u8| matches!(t, 1 | 3 | 5 | 6 | 7 | 8);
        match sa {
            out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE_EXISTING_KEY => {
                if sa == out_sa::REGISTER && my_key.unwrap_or(0) != p.key {
                    return Ok(Outcome::conflict());
                }
                if p.sa_key == 0 {
                    if let Some(i) = mine {
                        self.registrations.remove(i);
                        if let Some((n, _, t)) = self.holder.clone()
                            && &n == nexus
                        {
                            // An all-registrants reservation survives while anyone is registered.
                            self.holder = match (all_registrants(t), self.registrations.first()) {
                                (true, Some((other, k))) => Some((other.clone(), *k, t)),
                                _ => None,
                            };
                        }
                    }
                } else if let Some(i) = mine {
                    self.registrations[i].1 = p.sa_key;
                    if let Some(h) = self.holder.as_mut().filter(|(n, _, _)| n == nexus) {
                        h.1 = p.sa_key;
                    }
                } else {
                    // Registrations outlive their sessions (and go to the reservation file or
                    // the cluster with every change): a unit keeps a bounded number.
                    if self.registrations.len() >= MAX_REGISTRATIONS {
                        return Err(illegal(AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES));
                    }
                    self.registrations.push((nexus.clone(), p.sa_key));
                }
                self.generation = self.generation.wrapping_add(1);
            }
            out_sa::RESERVE => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                if scope != 0 || !valid_type(ty) {
                    return Err(bad_field(2, None));
                }
                match &self.holder {
                    Some((n, _, t)) if n != nexus || *t != ty => return Ok(Outcome::conflict()),
                    Some(_) => {}
                    None => self.holder = Some((nexus.clone(), p.key, ty)),
                }
            }
            out_sa::RELEASE => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                if let Some((n, _, t)) = &self.holder
                    && n == nexus
                {
                    if *t != ty {
                        return Err(illegal(AscAscq::new(0x26, 0x04)));
                    }
                    self.holder = None;
                }
            }
            out_sa::CLEAR => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                self.registrations.clear();
                self.holder = None;
                self.generation = self.generation.wrapping_add(1);
            }
            out_sa::PREEMPT | out_sa::PREEMPT_AND_ABORT => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                let victim_holds = self.holder.as_ref().is_some_and(|(_, k, _)| *k == p.sa_key);
                self.registrations.retain(|(n, k)| *k != p.sa_key || n == nexus);
                if victim_holds {
                    if !valid_type(ty) {
                        return Err(bad_field(2, None));
                    }
                    self.holder = Some((nexus.clone(), p.key, ty));
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(bad_field(1, Some(4))),
        }
        Ok(Outcome::good(Bytes::new()))
    }
}
