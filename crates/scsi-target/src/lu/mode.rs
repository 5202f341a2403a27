//! MODE SENSE and MODE SELECT (6/10): the Caching, Control and Informational Exceptions pages.

use super::{LogicalUnit, Outcome, R, bad_field, illegal, truncate};
use bytes::Bytes;
use riser_scsi::mode::{self, Caching, Control, InformationalExceptions, ModeHeader, ModePage};
use riser_scsi::sense::{AscAscq, Sense};

impl LogicalUnit {
    fn mode_pages(&self, pc: u8) -> Vec<ModePage> {
        let s = self.st();
        let changeable = pc == 1;
        let caching = if changeable { Caching { wce: self.cache_changeable(), rcd: false } } else { Caching { wce: s.wce, rcd: false } };
        let control = if changeable {
            Control { d_sense: true, swp: true, ..Control::default() }
        } else {
            Control { d_sense: s.d_sense, swp: s.swp, tas: false, queue_algorithm: 1, ..Control::default() }
        };
        let mut pages = vec![caching.to_page(), control.to_page(), InformationalExceptions::default().to_page()];
        if changeable {
            for p in &mut pages {
                if p.code == mode::page::CONTROL {
                    // Only D_SENSE and SWP are changeable.
                    let mut d = vec![0u8; p.data.len()];
                    d[0] = 0x04;
                    d[2] = 0x08;
                    p.data = d;
                } else if p.code == mode::page::INFORMATIONAL_EXCEPTIONS {
                    p.data.fill(0);
                }
            }
        }
        pages
    }

    pub(super) fn mode_sense(&self, m: &riser_scsi::cdb::ModeSense) -> R {
        if m.pc == 3 {
            return Err(illegal(AscAscq::SAVING_PARAMETERS_NOT_SUPPORTED));
        }
        let all = self.mode_pages(m.pc);
        let pages: Vec<ModePage> = match (m.page, m.subpage) {
            (mode::page::ALL, 0 | 0xff) => all,
            (p, 0) => all.into_iter().filter(|x| x.code == p).collect(),
            _ => Vec::new(),
        };
        if pages.is_empty() {
            return Err(bad_field(2, Some(5)));
        }
        // The capacity comes from the backend: ask it without the state lock held.
        let swp = self.st().swp;
        let header = ModeHeader {
            medium_type: 0,
            device_specific: mode::device_specific::DPOFUA | if swp { mode::device_specific::WP } else { 0 },
            block_descriptor: (!m.dbd).then(|| (self.blocks(), self.bs())),
        };
        let data = mode::mode_sense_data(m.ten, &header, &pages);
        Ok(Outcome::good(truncate(data, u32::from(m.alloc_len))))
    }

    pub(super) fn mode_select(&self, m: &riser_scsi::cdb::ModeSelect, out: &[u8]) -> R {
        if m.sp {
            return Err(bad_field(1, Some(0)));
        }
        if !m.pf {
            return Err(bad_field(1, Some(4)));
        }
        if out.is_empty() {
            return Ok(Outcome::good(Bytes::new()));
        }
        let (_, pages) = mode::parse_mode_parameters(m.ten, out).map_err(|e| e.sense(false))?;
        let mut s = self.st();
        for p in pages {
            match p.code {
                mode::page::CACHING => {
                    let wce = Caching::parse(&p.data).map_err(|e| e.sense(false))?.wce;
                    if wce != s.wce && !self.cache_changeable() {
                        // A store without a write cache: WCE is not changeable.
                        return Err(Sense::invalid_field_in_parameter_list(0, None));
                    }
                    s.wce = wce;
                }
                mode::page::CONTROL => {
                    let c = Control::parse(&p.data).map_err(|e| e.sense(false))?;
                    s.d_sense = c.d_sense;
                    s.swp = c.swp;
                }
                mode::page::INFORMATIONAL_EXCEPTIONS => {}
                _ => return Err(Sense::invalid_field_in_parameter_list(0, None)),
            }
        }
        Ok(Outcome::good(Bytes::new()))
    }
}
