//! Measuring a client run beside a target process: CPU seconds of both, the example
//! initiator's throughput, medians.

use crate::root;
use std::process::Command;

/// CPU seconds (user + system) from a /proc stat line: fields `first` and `first + 1` after
/// the command name (utime/stime of a process, or cutime/cstime of its waited-for children).
pub(crate) fn proc_cpu(path: &str, first: usize) -> f64 {
    let tick =
        Command::new("getconf").arg("CLK_TCK").output().ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let after = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // After ")" come state (not numeric, skipped), ppid, … : field N of stat is f[N - 4].
    let get = |n: usize| f.get(n - 4).copied().unwrap_or(0.0);
    (get(first) + get(first + 1)) / tick.unwrap_or(100.0)
}

/// A client program run to completion beside a target process.
pub(crate) struct Measured {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) success: bool,
    /// CPU seconds (user + system) the target process spent meanwhile.
    pub(crate) target_cpu_s: f64,
    /// CPU seconds of the client (and of every process it waited for).
    pub(crate) client_cpu_s: f64,
    pub(crate) wall_s: f64,
}

/// Run `cmd` to completion while measuring the CPU time of the target process `target_pid`
/// and of the client (as a child of this process: /proc/self/stat's cutime and cstime).
pub(crate) fn measured(target_pid: u32, cmd: &mut Command) -> Result<Measured, String> {
    let target_stat = format!("/proc/{target_pid}/stat");
    let (t0, c0, w0) = (proc_cpu(&target_stat, 14), proc_cpu("/proc/self/stat", 16), std::time::Instant::now());
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    Ok(Measured {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
        target_cpu_s: proc_cpu(&target_stat, 14) - t0,
        client_cpu_s: proc_cpu("/proc/self/stat", 16) - c0,
        wall_s: w0.elapsed().as_secs_f64(),
    })
}

/// What one run of the example initiator measured.
pub(crate) struct Sample {
    pub(crate) mib_s: f64,
    pub(crate) target_cpu_s: f64,
    pub(crate) initiator_cpu_s: f64,
}

/// One `read` or `write` of the example initiator against `url` (`extra`: more of its options):
/// the MiB/s it reports, and the CPU seconds the target process `target_pid` and the
/// initiator spent meanwhile.
pub(crate) fn initiator_run(target_pid: u32, op: &str, url: &str, size: u64, bs: u64, qd: u32, extra: &[&str]) -> Result<Sample, String> {
    initiator_run_from(&root().join("target/release/examples"), target_pid, op, url, size, bs, qd, extra)
}

/// [`initiator_run`] with the example initiator of the build in `examples`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn initiator_run_from(
    examples: &std::path::Path,
    target_pid: u32,
    op: &str,
    url: &str,
    size: u64,
    bs: u64,
    qd: u32,
    extra: &[&str],
) -> Result<Sample, String> {
    let m = measured(
        target_pid,
        Command::new(examples.join("initiator"))
            .args([op, url, "--size", &size.to_string(), "--block-size", &bs.to_string(), "--queue-depth", &qd.to_string()])
            .args(extra),
    )?;
    let mib_s = m.stdout.split('(').nth(1).and_then(|r| r.split_whitespace().next()).and_then(|x| x.parse::<f64>().ok());
    let mib_s = mib_s.ok_or_else(|| format!("initiator {op} {url}: {}{}", m.stdout, m.stderr))?;
    Ok(Sample { mib_s, target_cpu_s: m.target_cpu_s, initiator_cpu_s: m.client_cpu_s })
}

/// `sessions` runs of the example initiator at once (each a session of its own moving `size`
/// bytes), as [`initiator_run`]: the aggregate MiB/s (every session's bytes over the longest
/// transfer time any of them reports, so their logins do not count), and the CPU seconds of
/// the target and of all the initiators meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sessions_run(target_pid: u32, op: &str, url: &str, size: u64, bs: u64, qd: u32, sessions: usize) -> Result<Sample, String> {
    if sessions <= 1 {
        return initiator_run(target_pid, op, url, size, bs, qd, &[]);
    }
    let target_stat = format!("/proc/{target_pid}/stat");
    let (t0, c0) = (proc_cpu(&target_stat, 14), proc_cpu("/proc/self/stat", 16));
    let children: Vec<_> = (0..sessions)
        .map(|_| {
            Command::new(root().join("target/release/examples/initiator"))
                .args([op, url, "--size", &size.to_string(), "--block-size", &bs.to_string(), "--queue-depth", &qd.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("initiator: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut longest = 0.0f64;
    for child in children {
        let out = child.wait_with_output().map_err(|e| format!("initiator: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        // "read 256 MiB in 0.27 s (941.6 MiB/s)": the time from the rate (the seconds are
        // printed to 10 ms, a tenth of a short run).
        let mib_s = stdout.split('(').nth(1).and_then(|r| r.split_whitespace().next()).and_then(|x| x.parse::<f64>().ok());
        let mib_s = mib_s.ok_or_else(|| format!("initiator {op} {url}: {stdout}{}", String::from_utf8_lossy(&out.stderr)))?;
        longest = longest.max(size as f64 / (1u64 << 20) as f64 / mib_s);
    }
    Ok(Sample {
        mib_s: (size * sessions as u64) as f64 / (1u64 << 20) as f64 / longest,
        target_cpu_s: proc_cpu(&target_stat, 14) - t0,
        initiator_cpu_s: proc_cpu("/proc/self/stat", 16) - c0,
    })
}

/// The median (of an even count, the mean of the middle two; NaN for none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
