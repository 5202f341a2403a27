//! MODE SENSE / MODE SELECT parameter data (SPC-5 §7.5): headers, block descriptor, and the
//! Caching (0x08), Control (0x0A) and Informational Exceptions Control (0x1C) pages.

use crate::Error;
use crate::be::{need, put_u16, put_u24, put_u32, u16_at, u24_at, u32_at};
use alloc::vec::Vec;

/// Page codes.
#[allow(missing_docs)]
pub mod page {
    pub const READ_WRITE_ERROR_RECOVERY: u8 = 0x01;
    pub const CACHING: u8 = 0x08;
    pub const CONTROL: u8 = 0x0a;
    pub const INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
    pub const ALL: u8 = 0x3f;
}

/// Device-specific parameter bits of the mode header for a block device.
pub mod device_specific {
    /// Write protected.
    pub const WP: u8 = 0x80;
    /// DPO and FUA supported.
    pub const DPOFUA: u8 = 0x10;
}

/// One mode page in page_0 or sub_page format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModePage {
    /// Page code (6 bits).
    pub code: u8,
    /// Subpage (0 = page_0 format).
    pub subpage: u8,
    /// Parameters saveable.
    pub ps: bool,
    /// Page parameters (after the page header).
    pub data: Vec<u8>,
}

impl ModePage {
    /// Encode with its header.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.data.len() + 4);
        let ps = if self.ps { 0x80 } else { 0 };
        if self.subpage == 0 {
            b.push(ps | (self.code & 0x3f));
            b.push(self.data.len() as u8);
        } else {
            b.push(ps | 0x40 | (self.code & 0x3f));
            b.push(self.subpage);
            let mut l = [0u8; 2];
            put_u16(&mut l, 0, self.data.len() as u16);
            b.extend_from_slice(&l);
        }
        b.extend_from_slice(&self.data);
        b
    }

    /// Parse a sequence of mode pages.
    pub fn parse_all(mut b: &[u8]) -> Result<Vec<Self>, Error> {
        let mut out = Vec::new();
        while !b.is_empty() {
            need("mode page", b, 2)?;
            let spf = b[0] & 0x40 != 0;
            let (subpage, hdr, len) = if spf {
                need("mode subpage", b, 4)?;
                (b[1], 4, usize::from(u16_at(b, 2)))
            } else {
                (0, 2, usize::from(b[1]))
            };
            need("mode page", b, hdr + len)?;
            out.push(Self { code: b[0] & 0x3f, subpage, ps: b[0] & 0x80 != 0, data: b[hdr..hdr + len].to_vec() });
            b = &b[hdr + len..];
        }
        Ok(out)
    }
}

/// Caching page (0x08), 0x12 bytes of parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Caching {
    /// Write cache enable.
    pub wce: bool,
    /// Read cache disable.
    pub rcd: bool,
}

impl Caching {
    /// As a mode page.
    pub fn to_page(&self) -> ModePage {
        let mut data = alloc::vec![0u8; 0x12];
        data[0] = if self.wce { 0x04 } else { 0 } | u8::from(self.rcd);
        ModePage { code: page::CACHING, subpage: 0, ps: false, data }
    }
    /// From page parameters.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        need("caching mode page", data, 1)?;
        Ok(Self { wce: data[0] & 0x04 != 0, rcd: data[0] & 0x01 != 0 })
    }
}

/// Control page (0x0A), 0x0A bytes of parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Control {
    /// Task set type (3 bits).
    pub tst: u8,
    /// Descriptor format sense data.
    pub d_sense: bool,
    /// Queue algorithm modifier (4 bits; 1 = unrestricted reordering).
    pub queue_algorithm: u8,
    /// Queue error management (2 bits).
    pub qerr: u8,
    /// Task aborted status.
    pub tas: bool,
    /// Software write protect.
    pub swp: bool,
}

impl Control {
    /// As a mode page.
    pub fn to_page(&self) -> ModePage {
        let mut data = alloc::vec![0u8; 0x0a];
        data[0] = (self.tst << 5) | if self.d_sense { 0x04 } else { 0 };
        data[1] = (self.queue_algorithm << 4) | ((self.qerr & 3) << 1);
        // Page byte 4 (SWP) and byte 5 (TAS).
        data[2] = if self.swp { 0x08 } else { 0 };
        data[3] = if self.tas { 0x40 } else { 0 };
        // BUSY TIMEOUT PERIOD: unlimited; EXTENDED SELF-TEST COMPLETION TIME: 0.
        put_u16(&mut data, 6, 0xffff);
        ModePage { code: page::CONTROL, subpage: 0, ps: false, data }
    }
    /// From page parameters.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        need("control mode page", data, 4)?;
        Ok(Self {
            tst: data[0] >> 5,
            d_sense: data[0] & 0x04 != 0,
            queue_algorithm: data[1] >> 4,
            qerr: (data[1] >> 1) & 3,
            tas: data[3] & 0x40 != 0,
            swp: data[2] & 0x08 != 0,
        })
    }
}

/// Informational Exceptions Control page (0x1C), 0x0A bytes of parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InformationalExceptions {
    /// Byte 2 flags (PERF 0x80, EBF 0x20, EWASC 0x10, DEXCPT 0x08, TEST 0x04, LOGERR 0x01).
    pub flags: u8,
    /// Method of reporting informational exceptions (4 bits).
    pub mrie: u8,
    /// Interval timer.
    pub interval_timer: u32,
    /// Report count.
    pub report_count: u32,
}

impl InformationalExceptions {
    /// As a mode page.
    pub fn to_page(&self) -> ModePage {
        let mut data = alloc::vec![0u8; 0x0a];
        data[0] = self.flags;
        data[1] = self.mrie & 0x0f;
        put_u32(&mut data, 2, self.interval_timer);
        put_u32(&mut data, 6, self.report_count);
        ModePage { code: page::INFORMATIONAL_EXCEPTIONS, subpage: 0, ps: false, data }
    }
    /// From page parameters.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        need("informational exceptions mode page", data, 10)?;
        Ok(Self { flags: data[0], mrie: data[1] & 0x0f, interval_timer: u32_at(data, 2), report_count: u32_at(data, 6) })
    }
}

/// The header and optional short block descriptor of a mode parameter list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ModeHeader {
    /// Medium type.
    pub medium_type: u8,
    /// Device-specific parameter ([`device_specific`]).
    pub device_specific: u8,
    /// Block descriptor: (number of blocks, block length).
    pub block_descriptor: Option<(u64, u32)>,
}

/// Build MODE SENSE parameter data: header (6 or 10), block descriptor, pages.
pub fn mode_sense_data(ten: bool, header: &ModeHeader, pages: &[ModePage]) -> Vec<u8> {
    let hlen = if ten { 8 } else { 4 };
    let mut b = alloc::vec![0u8; hlen];
    let (mt, ds) = if ten { (2, 3) } else { (1, 2) };
    b[mt] = header.medium_type;
    b[ds] = header.device_specific;
    if let Some((blocks, len)) = header.block_descriptor {
        let mut d = [0u8; 8];
        put_u32(&mut d, 0, blocks.min(0xffff_ffff) as u32);
        put_u24(&mut d, 5, len);
        b.extend_from_slice(&d);
        if ten {
            put_u16(&mut b, 6, 8);
        } else {
            b[3] = 8;
        }
    }
    for p in pages {
        b.extend_from_slice(&p.to_bytes());
    }
    if ten {
        let l = (b.len() - 2) as u16;
        put_u16(&mut b, 0, l);
    } else {
        b[0] = (b.len() - 1).min(255) as u8;
    }
    b
}

/// Parse a MODE SELECT (or MODE SENSE) parameter list.
pub fn parse_mode_parameters(ten: bool, b: &[u8]) -> Result<(ModeHeader, Vec<ModePage>), Error> {
    let hlen = if ten { 8 } else { 4 };
    need("mode parameter header", b, hlen)?;
    let (medium_type, device_specific, bdl) = if ten { (b[2], b[3], usize::from(u16_at(b, 6))) } else { (b[1], b[2], usize::from(b[3])) };
    need("mode block descriptors", b, hlen + bdl)?;
    let block_descriptor = (bdl >= 8).then(|| {
        let d = &b[hlen..hlen + 8];
        (u64::from(u32_at(d, 0)), u24_at(d, 5))
    });
    if bdl != 0 && bdl != 8 && bdl % 8 != 0 {
        return Err(Error::InvalidField { what: "mode block descriptor length", byte: if ten { 6 } else { 3 }, bit: None });
    }
    let pages = ModePage::parse_all(&b[hlen + bdl..])?;
    Ok((ModeHeader { medium_type, device_specific, block_descriptor }, pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_sense_6_caching() {
        let h = ModeHeader { device_specific: device_specific::DPOFUA, block_descriptor: Some((2048, 512)), ..Default::default() };
        let b = mode_sense_data(false, &h, &[Caching { wce: true, rcd: false }.to_page()]);
        assert_eq!(b.len(), 4 + 8 + 2 + 0x12);
        assert_eq!(&b[..4], &[(b.len() - 1) as u8, 0, 0x10, 8]);
        assert_eq!(&b[12..15], &[0x08, 0x12, 0x04]);
        let (h2, pages) = parse_mode_parameters(false, &b).unwrap();
        assert_eq!(h2, h);
        assert_eq!(Caching::parse(&pages[0].data).unwrap(), Caching { wce: true, rcd: false });
    }

    #[test]
    fn mode_sense_10_all_pages() {
        let pages = [
            Caching::default().to_page(),
            Control { d_sense: true, tas: true, queue_algorithm: 1, ..Default::default() }.to_page(),
            InformationalExceptions::default().to_page(),
        ];
        let b = mode_sense_data(true, &ModeHeader::default(), &pages);
        assert_eq!(u16_at(&b, 0) as usize, b.len() - 2);
        let (_, p) = parse_mode_parameters(true, &b).unwrap();
        assert_eq!(p, pages);
        let c = Control::parse(&p[1].data).unwrap();
        assert!(c.d_sense && c.tas);
    }

    #[test]
    fn subpage_and_truncation() {
        let p = ModePage { code: 0x0a, subpage: 1, ps: true, data: alloc::vec![1, 2, 3] };
        let b = p.to_bytes();
        assert_eq!(ModePage::parse_all(&b).unwrap(), [p]);
        assert!(ModePage::parse_all(&b[..5]).is_err());
        assert!(parse_mode_parameters(false, &[3, 0, 0, 8, 0]).is_err());
    }
}
