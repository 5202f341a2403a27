//! `cargo xtask public-api [--bless]`: the public API of every published library crate (default
//! features), as cargo-public-api lists it from rustdoc's JSON (blanket impls left out), against
//! the baseline committed in `api/CRATE.txt`. Any difference fails with a unified diff, so an API
//! change is always a reviewed change of its listing; `--bless` writes the listings after an
//! intended one (and the CHANGELOG says what changed).

use crate::root;
use std::process::Command;

/// The published library crates (riser-cli has only binaries; xtask is not published).
const CRATES: &[&str] = &[
    "riser-scsi",
    "riser-iscsi",
    "riser-datamover",
    "riser-tcp",
    "riser-verbs",
    "riser-iwarp",
    "riser-iser",
    "riser-rbd",
    "riser-target",
    "riser-initiator",
    "riser-service",
    "riser",
];

/// The cargo-public-api release the listings are made with (its output format is part of the
/// baseline).
const TOOL_VERSION: &str = "0.52.0";

fn ensure_tool() -> Result<(), String> {
    let have = Command::new("cargo").args(["public-api", "--version"]).output().ok().filter(|o| o.status.success());
    if have.is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim().ends_with(TOOL_VERSION)) {
        return Ok(());
    }
    println!("installing cargo-public-api {TOOL_VERSION}");
    let ok = Command::new("cargo")
        .args(["install", "cargo-public-api", "--locked", "--version", TOOL_VERSION])
        .status()
        .map_err(|e| format!("cargo install cargo-public-api: {e}"))?;
    if !ok.success() {
        return Err("cargo install cargo-public-api failed".into());
    }
    Ok(())
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let bless = args.iter().any(|a| a == "--bless");
    ensure_tool()?;
    let dir = root().join("api");
    let scratch = root().join("target/public-api");
    std::fs::create_dir_all(&dir).and_then(|()| std::fs::create_dir_all(&scratch)).map_err(|e| format!("api dirs: {e}"))?;
    let mut changed = Vec::new();
    for krate in CRATES {
        let out = Command::new("cargo")
            .args(["public-api", "--color", "never", "-p", krate, "-s"])
            .current_dir(root())
            .output()
            .map_err(|e| format!("cargo public-api -p {krate}: {e}"))?;
        if !out.status.success() {
            return Err(format!("cargo public-api -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let baseline = dir.join(format!("{krate}.txt"));
        if bless {
            std::fs::write(&baseline, &listing).map_err(|e| format!("{}: {e}", baseline.display()))?;
            println!("{krate}: {} items written to api/{krate}.txt", listing.lines().count());
            continue;
        }
        let old = std::fs::read_to_string(&baseline).unwrap_or_default();
        if old == listing {
            println!("{krate}: {} items, as the baseline", listing.lines().count());
            continue;
        }
        let now = scratch.join(format!("{krate}.txt"));
        std::fs::write(&now, &listing).map_err(|e| format!("{}: {e}", now.display()))?;
        let diff = Command::new("diff").arg("-u").arg(&baseline).arg(&now).output().map_err(|e| format!("diff: {e}"))?;
        println!("{krate}: the public API differs from api/{krate}.txt:\n{}", String::from_utf8_lossy(&diff.stdout));
        changed.push(*krate);
    }
    if changed.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the public API of {} changed: if that is intended, run `cargo xtask public-api --bless`, commit api/ and say what changed in CHANGELOG.md",
        changed.join(", ")
    ))
}
