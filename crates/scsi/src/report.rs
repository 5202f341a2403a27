//! REPORT LUNS data (SPC-5 §6.35) and REPORT SUPPORTED OPERATION CODES data (§6.36).

use crate::Error;
use crate::be::{need, put_u16, put_u32, u16_at, u32_at};
use crate::lun::Lun;
use alloc::vec::Vec;

/// Encode REPORT LUNS parameter data.
pub fn report_luns_to_bytes(luns: &[Lun]) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 8];
    put_u32(&mut b, 0, (8 * luns.len()) as u32);
    for l in luns {
        b.extend_from_slice(&l.0);
    }
    b
}

/// Parse REPORT LUNS parameter data (as many LUNs as the buffer holds).
pub fn parse_report_luns(b: &[u8]) -> Result<Vec<Lun>, Error> {
    need("REPORT LUNS data", b, 8)?;
    let end = (8 + u32_at(b, 0) as usize).min(b.len());
    Ok(b[8..end]
        .chunks_exact(8)
        .map(|c| {
            let mut l = [0u8; 8];
            l.copy_from_slice(c);
            Lun(l)
        })
        .collect())
}

/// One entry of the all-commands format of REPORT SUPPORTED OPERATION CODES.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandDescriptor {
    /// Operation code.
    pub opcode: u8,
    /// Service action, when `service_action_valid`.
    pub service_action: u16,
    /// SERVACTV.
    pub service_action_valid: bool,
    /// CDB length.
    pub cdb_len: u16,
}

impl CommandDescriptor {
    fn emit(&self, out: &mut Vec<u8>, rctd: bool) {
        let mut d = [0u8; 8];
        d[0] = self.opcode;
        put_u16(&mut d, 2, self.service_action);
        d[5] = u8::from(self.service_action_valid) | if rctd { 0x02 } else { 0 };
        put_u16(&mut d, 6, self.cdb_len);
        out.extend_from_slice(&d);
        if rctd {
            // Command timeouts descriptor: length 0x0A, no timeouts reported.
            out.extend_from_slice(&[0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
    }
}

/// Encode the all-commands parameter data; `rctd` adds a timeouts descriptor to each.
pub fn all_commands_to_bytes(cmds: &[CommandDescriptor], rctd: bool) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 4];
    for c in cmds {
        c.emit(&mut b, rctd);
    }
    let l = (b.len() - 4) as u32;
    put_u32(&mut b, 0, l);
    b
}

/// Parse all-commands parameter data.
pub fn parse_all_commands(b: &[u8]) -> Result<Vec<CommandDescriptor>, Error> {
    need("REPORT SUPPORTED OPERATION CODES data", b, 4)?;
    let end = (4 + u32_at(b, 0) as usize).min(b.len());
    let mut at = 4;
    let mut out = Vec::new();
    while at + 8 <= end {
        let d = &b[at..at + 8];
        out.push(CommandDescriptor {
            opcode: d[0],
            service_action: u16_at(d, 2),
            service_action_valid: d[5] & 1 != 0,
            cdb_len: u16_at(d, 6),
        });
        at += if d[5] & 0x02 != 0 { 20 } else { 8 };
    }
    Ok(out)
}

/// Encode the one-command parameter data: SUPPORT field (3 = supported per standard,
/// 1 = not supported) and the CDB usage map (which bits of each CDB byte the device looks at).
pub fn one_command_to_bytes(support: u8, usage: &[u8], rctd: bool) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 4];
    b[1] = (support & 7) | if rctd { 0x80 } else { 0 };
    put_u16(&mut b, 2, usage.len() as u16);
    b.extend_from_slice(usage);
    if rctd {
        b.extend_from_slice(&[0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    b
}

/// Parse one-command parameter data into (SUPPORT, CDB usage map).
pub fn parse_one_command(b: &[u8]) -> Result<(u8, &[u8]), Error> {
    need("one-command data", b, 4)?;
    let n = usize::from(u16_at(b, 2));
    need("one-command data", b, 4 + n)?;
    Ok((b[1] & 7, &b[4..4 + n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_luns() {
        let luns = [Lun::ZERO, Lun::from_number(1).unwrap(), Lun::from_number(300).unwrap()];
        let b = report_luns_to_bytes(&luns);
        assert_eq!(&b[..8], &[0, 0, 0, 24, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&b).unwrap(), luns);
        // Allocation length smaller than the list: what fits.
        assert_eq!(parse_report_luns(&b[..16]).unwrap(), [Lun::ZERO]);
    }

    #[test]
    fn rsoc() {
        let cmds = [
            CommandDescriptor { opcode: 0x28, service_action: 0, service_action_valid: false, cdb_len: 10 },
            CommandDescriptor { opcode: 0x9e, service_action: 0x10, service_action_valid: true, cdb_len: 16 },
        ];
        for rctd in [false, true] {
            assert_eq!(parse_all_commands(&all_commands_to_bytes(&cmds, rctd)).unwrap(), cmds);
        }
        let b = one_command_to_bytes(3, &[0x28, 0x1a, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07], false);
        assert_eq!(parse_one_command(&b).unwrap().0, 3);
    }
}
