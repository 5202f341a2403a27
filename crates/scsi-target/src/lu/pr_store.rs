//! The persistent reservation state of a unit ([`Pr`], what `pr` changes), and the file where a
//! unit keeps it while APTPL is active (SPC-5 §5.14.5), so that it survives a restart of the
//! target.
//!
//! The file exists only while APTPL is active: the unit writes it whole after every PERSISTENT
//! RESERVE OUT that changes the state, and removes it when an application client turns APTPL
//! off. Each write is atomic: a temporary file beside it (mode 0600) is written and synced,
//! renamed over the file, and the directory synced, so a crash leaves the old state or the new,
//! never a mix.
//!
//! # Format (version 1)
//!
//! UTF-8 text, one record a line, fields separated by single spaces:
//!
//! ```text
//! riser-pr-state 1
//! # comment lines (and blank lines) are ignored
//! aptpl 1
//! registration <initiator port> <target port> <relative port> <key>
//! holder <initiator port> <target port> <relative port> <key> <type>
//! end
//! ```
//!
//! The first line names the format and its version. `aptpl` comes once (the file only exists
//! while APTPL is active, so its value is 1). A `registration` line per registered I_T nexus, in
//! registration order; `holder` at most once, the reservation holder. Ports are the nexus's
//! ([`Nexus::initiator_port`], [`Nexus::target_port`]), with every byte outside printable ASCII
//! and `%` written `%XX` (an empty port is `-`, a port that is `-` itself `%2D`); relative ports
//! and types are decimal, keys `0x` and 16 hexadecimal digits. `end` closes the file: a reader
//! refuses a file without it. The PR generation is not kept: a power on sets it to zero
//! whatever APTPL says (SPC-5 §6.16.2).

use super::Nexus;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The first line of a version 1 file.
const MAGIC: &str = "riser-pr-state";
/// The format version this code writes (and the only one it reads).
const VERSION: u32 = 1;

/// The persistent reservation state of a unit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Pr {
    /// PRgeneration (SPC-5 §6.16.2).
    pub(super) generation: u32,
    /// Registered I_T nexuses and their keys, in registration order.
    pub(super) registrations: Vec<(Nexus, u64)>,
    /// The reservation: its holder, the holder's key and the type.
    pub(super) holder: Option<(Nexus, u64, u8)>,
    /// APTPL is active (SPC-5 §5.14.5): the state is kept in the unit's file as well (never set
    /// on a unit without one).
    pub(super) aptpl: bool,
}

/// A unit's persistent reservation file.
#[derive(Debug)]
pub(super) struct PrStore {
    path: PathBuf,
    /// The directory the file lives in (synced after each rename or removal).
    dir: PathBuf,
    /// The temporary file each write goes through, beside the file.
    tmp: PathBuf,
    /// Held by a PERSISTENT RESERVE OUT from before it reads the state until it has committed
    /// it, so one command's write never races another's and the unit's state lock is free
    /// while the file is synced.
    serial: Mutex<()>,
}

impl PrStore {
    /// The store at `path` (nothing is read or written yet). Refuses a path without a file
    /// name.
    pub(super) fn new(path: PathBuf) -> io::Result<Self> {
        let Some(name) = path.file_name() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("persistent reservation file {}: not a file name", path.display()),
            ));
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(".tmp");
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Self { tmp: dir.join(tmp_name), dir, path, serial: Mutex::new(()) })
    }

    /// The file's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// One PERSISTENT RESERVE OUT at a time (see `serial`).
    pub(super) fn serialize(&self) -> MutexGuard<'_, ()> {
        self.serial.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state the file holds, `None` when there is no file. A file that cannot be read or
    /// parsed is an error naming the path (InvalidData when malformed).
    pub(super) fn load(&self) -> io::Result<Option<Pr>> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io::Error::new(e.kind(), format!("persistent reservation file {}: {e}", self.path.display()))),
        };
        let malformed = |why: String| {
            io::Error::new(io::ErrorKind::InvalidData, format!("persistent reservation file {} is malformed: {why}", self.path.display()))
        };
        let text = String::from_utf8(bytes).map_err(|_| malformed("not UTF-8".into()))?;
        decode(&text).map(Some).map_err(malformed)
    }

    /// Replace the file by `pr`, atomically and durably (see the module documentation).
    pub(super) fn save(&self, pr: &Pr) -> io::Result<()> {
        let text = encode(pr);
        let _ = fs::remove_file(&self.tmp);
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&self.tmp)?;
        let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
        drop(f);
        if let Err(e) = written.and_then(|()| fs::rename(&self.tmp, &self.path)) {
            let _ = fs::remove_file(&self.tmp);
            return Err(e);
        }
        File::open(&self.dir)?.sync_all()
    }

    /// Remove the file (APTPL turned off), durably. No file is no error.
    pub(super) fn remove(&self) -> io::Result<()> {
        match fs::remove_file(&self.path) {
            Ok(()) => File::open(&self.dir)?.sync_all(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The file's text for `pr`.
fn encode(pr: &Pr) -> String {
    encode_as(pr, false)
}

/// The state as the gateways exporting one store share it (through the cluster): the file's
/// records, APTPL whichever it is, and PRgeneration.
pub(super) fn to_shared_text(pr: &Pr) -> String {
    encode_as(pr, true)
}

/// The shared state's text, read back (see [`to_shared_text`]).
pub(super) fn from_shared_text(text: &str) -> Result<Pr, String> {
    decode_as(text, true)
}

fn encode_as(pr: &Pr, shared: bool) -> String {
    let mut s = format!("{MAGIC} {VERSION}\n");
    s.push_str("# riser-target persistent reservations (SPC-5 APTPL); rewritten whole on every change\n");
    let _ = writeln!(s, "aptpl {}", u8::from(pr.aptpl));
    if shared {
        let _ = writeln!(s, "generation {}", pr.generation);
    }
    for (n, key) in &pr.registrations {
        let _ = writeln!(s, "registration {} {:#018x}", nexus_fields(n), key);
    }
    if let Some((n, key, ty)) = &pr.holder {
        let _ = writeln!(s, "holder {} {:#018x} {ty}", nexus_fields(n), key);
    }
    s.push_str("end\n");
    s
}

fn nexus_fields(n: &Nexus) -> String {
    format!("{} {} {}", escape(n.initiator_port()), escape(n.target_port()), n.relative_port())
}

/// Parse a file's text (the error says what is wrong, and where).
fn decode(text: &str) -> Result<Pr, String> {
    decode_as(text, false)
}

fn decode_as(text: &str, shared: bool) -> Result<Pr, String> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    match lines.next().map(|(_, l)| l.split(' ').collect::<Vec<_>>()).as_deref() {
        Some([MAGIC, v]) if *v == VERSION.to_string() => {}
        Some([MAGIC, v]) => return Err(format!("format version {v}, this build reads version {VERSION}")),
        _ => return Err(format!("line 1: not a riser persistent reservation file (no `{MAGIC} {VERSION}` line)")),
    }
    let mut pr = Pr::default();
    let (mut aptpl, mut ended) = (None, false);
    for (no, line) in lines {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| format!("line {no}: {why}");
        if ended {
            return Err(at("text after `end`".into()));
        }
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["aptpl", v] => {
                if aptpl.is_some() {
                    return Err(at("a second `aptpl` line".into()));
                }
                // The file only exists while APTPL is active; a 0 here is no state of ours
                // (the state gateways share holds either).
                match (*v, shared) {
                    ("1", _) => aptpl = Some(true),
                    ("0", true) => aptpl = Some(false),
                    _ => return Err(at(format!("aptpl {v}: the file is only kept while APTPL is active (1)"))),
                }
            }
            ["generation", g] if shared => {
                pr.generation = g.parse().map_err(|_| at(format!("generation {g:?} is not a number")))?;
            }
            ["registration", i, t, rel, key] => {
                let n = nexus(i, t, rel).map_err(at)?;
                let key = parse_key(key).map_err(at)?;
                if key == 0 {
                    return Err(at("a registration with key 0".into()));
                }
                if pr.registrations.iter().any(|(m, _)| *m == n) {
                    return Err(at(format!("{n} registered twice")));
                }
                pr.registrations.push((n, key));
            }
            ["holder", i, t, rel, key, ty] => {
                if pr.holder.is_some() {
                    return Err(at("a second `holder` line".into()));
                }
                let n = nexus(i, t, rel).map_err(at)?;
                let key = parse_key(key).map_err(at)?;
                let ty = ty.parse::<u8>().ok().filter(|t| matches!(t, 1 | 3 | 5 | 6 | 7 | 8));
                let Some(ty) = ty else { return Err(at("not a persistent reservation type".into())) };
                pr.holder = Some((n, key, ty));
            }
            ["end"] => ended = true,
            _ => return Err(at(format!("not a record: {line:?}"))),
        }
    }
    if !ended {
        return Err("no `end` line (the file is cut short)".into());
    }
    pr.aptpl = aptpl.ok_or("no `aptpl` line")?;
    Ok(pr)
}

fn nexus(i: &str, t: &str, rel: &str) -> Result<Nexus, String> {
    let rel = rel.parse::<u16>().map_err(|_| format!("relative port {rel:?} is not a number from 0 to 65535"))?;
    Ok(Nexus::new(&unescape(i)?, &unescape(t)?, rel))
}

fn parse_key(k: &str) -> Result<u64, String> {
    k.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok()).ok_or_else(|| format!("key {k:?} is not 0x and hexadecimal digits"))
}

/// A port name as one field: no spaces, no control characters (see the module documentation).
fn escape(s: &str) -> String {
    match s {
        "" => "-".into(),
        "-" => "%2D".into(),
        _ => {
            let mut out = String::with_capacity(s.len());
            for &b in s.as_bytes() {
                if b.is_ascii_graphic() && b != b'%' {
                    out.push(char::from(b));
                } else {
                    let _ = write!(out, "%{b:02X}");
                }
            }
            out
        }
    }
}

fn unescape(s: &str) -> Result<String, String> {
    if s == "-" {
        return Ok(String::new());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let byte = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(byte.ok_or_else(|| format!("bad %-escape in {s:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once unescaped"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_round_trips() {
        let a = Nexus::new("iqn.a,i,0x1", "iqn.t,t,0x0001", 1);
        let odd = Nexus::new("odd name%é", "-", 7);
        let empty = Nexus::new("", "x", 65535);
        let pr = Pr {
            generation: 0,
            registrations: vec![(a.clone(), 0xfeed), (odd.clone(), u64::MAX), (empty.clone(), 1)],
            holder: Some((odd.clone(), u64::MAX, 5)),
            aptpl: true,
        };
        let text = encode(&pr);
        assert!(text.starts_with("riser-pr-state 1\n"), "{text}");
        assert!(text.contains("odd%20name%25%C3%A9 %2D 7 0xffffffffffffffff"), "{text}");
        let back = decode(&text).unwrap();
        assert_eq!(back, pr);
        for (n, m) in back.registrations.iter().map(|(n, _)| n).zip([&a, &odd, &empty]) {
            assert_eq!((n.initiator_port(), n.target_port(), n.relative_port()), (m.initiator_port(), m.target_port(), m.relative_port()));
        }
    }

    #[test]
    fn malformed_texts_are_refused() {
        let good = "riser-pr-state 1\naptpl 1\nregistration i t 1 0x01\nholder i t 1 0x01 1\nend\n";
        assert!(decode(good).is_ok());
        for (bad, says) in [
            ("riser-pr-state 2\naptpl 1\nend\n", "version 2"),
            ("aptpl 1\nend\n", "line 1"),
            ("riser-pr-state 1\naptpl 1\nregistration i t 1 0x01\n", "no `end`"),
            ("riser-pr-state 1\nregistration i t 1 0x01\nend\n", "no `aptpl`"),
            ("riser-pr-state 1\naptpl 0\nend\n", "line 2"),
            ("riser-pr-state 1\naptpl 1\nregistration i t 1 1\nend\n", "line 3"),
            ("riser-pr-state 1\naptpl 1\nregistration i t 70000 0x1\nend\n", "relative port"),
            ("riser-pr-state 1\naptpl 1\nregistration i t 1 0x1\nregistration i t 2 0x2\nend\n", "twice"),
            ("riser-pr-state 1\naptpl 1\nregistration i  t 1 0x1\nend\n", "not a record"),
            ("riser-pr-state 1\naptpl 1\nholder i t 1 0x1 2\nend\n", "type"),
            ("riser-pr-state 1\naptpl 1\nregistration i%zz t 1 0x1\nend\n", "escape"),
            ("riser-pr-state 1\naptpl 1\nend\nregistration i t 1 0x1\n", "after `end`"),
        ] {
            let e = decode(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
