//! `cargo xtask bench --rbd`: the same work through a riser gateway (an RBD image as the LUN of
//! the example target) and straight on librbd (`rbd bench`), in one run on one cluster: 4 KiB
//! random reads and writes and 1 MiB sequential reads and writes, queue depth 16 on both sides,
//! librbd's cache off on both sides. Through the gateway, three clients: libiscsi's iscsi-perf
//! (reads only), fio with the libiscsi engine, and the riser initiator's `load`.
//!
//! The runs are interleaved (rbd bench and each gateway client, for each workload, rep after
//! rep, each rep starting with another of them), so the machine's noise spreads over all of
//! them; a ratio is the median of each gateway run over the `rbd bench` run beside it. Before
//! every run the image is written whole, sequentially: random writes fragment the cluster's
//! memstore objects, and a run after them would measure that (see `rewrite`). Placement on the machine's two cores (`--pin`):
//! `split` (default) puts the cluster's monitor and OSD on CPU 0 and the rest (the gateway and its
//! client; `rbd bench`, which is librbd's client itself) on CPU 1; `none` lets everything float.
//! Each run also records the CPU time of the cluster's daemons, of the gateway and of the client
//! (/proc), as cores busy over the run and CPU microseconds per I/O, the CPU the rest of the
//! machine took meanwhile (it is shared), and how long the daemons' and the gateway's threads
//! waited for a core (schedstat), to show where a ratio below 1 goes. The "cost" column is the
//! ratio of CPU per I/O (rbd bench's over the gateway path's, Ceph included): what the throughput
//! ratio comes to where the work is CPU-bound on cores of its own.

use crate::rbd::{Ceph, build_rbd_examples, ensure_ceph};
use crate::{RunningTarget, arg_value, ensure_packages, measure::proc_cpu, median, shared};
use std::process::Command;
use std::time::Instant;

/// The benchmark's cluster: apart from the RBD suite's (which may run at the same time).
const CEPH_DIR: &str = "/tmp/riser-ceph-bench";
const CEPH_PORT: &str = "17889";
const IMAGE: &str = "rbd/bench";
const IMAGE_SIZE: u64 = 1 << 30;
const QD: u32 = 16;
const IQN: &str = "iqn.2026-11.io.riser:bench-rbd";

#[derive(Clone, Copy)]
struct Workload {
    /// fio's and the riser initiator's name of it.
    rw: &'static str,
    bs: u64,
}

impl Workload {
    fn random(self) -> bool {
        self.rw.starts_with("rand")
    }
    fn writes(self) -> bool {
        self.rw.ends_with("write")
    }
    /// IOPS for small blocks, MiB/s for large ones.
    fn unit(self) -> &'static str {
        if self.bs <= 8192 { "IOPS" } else { "MiB/s" }
    }
    fn value(self, iops: f64) -> f64 {
        if self.bs <= 8192 { iops } else { iops * self.bs as f64 / 1048576.0 }
    }
}

const WORKLOADS: [Workload; 4] = [
    Workload { rw: "randread", bs: 4096 },
    Workload { rw: "randwrite", bs: 4096 },
    Workload { rw: "read", bs: 1 << 20 },
    Workload { rw: "write", bs: 1 << 20 },
];

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    RbdBench,
    IscsiPerf,
    Fio,
    Initiator,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Self::RbdBench => "rbd bench",
            Self::IscsiPerf => "iscsi-perf",
            Self::Fio => "fio-libiscsi",
            Self::Initiator => "riser-initiator",
        }
    }
    /// What the tool can do: iscsi-perf only reads.
    fn runs(self, w: Workload) -> bool {
        !(self == Self::IscsiPerf && w.writes())
    }
}

const TOOLS: [Tool; 4] = [Tool::RbdBench, Tool::IscsiPerf, Tool::Fio, Tool::Initiator];

/// One run: I/O per second, and CPU seconds of the cluster's daemons, of the gateway and of the
/// client over `wall` seconds.
#[derive(Clone, Copy, Default)]
struct Run {
    iops: f64,
    wall: f64,
    ceph_cpu: f64,
    gateway_cpu: f64,
    client_cpu: f64,
    /// CPU seconds of the whole machine (every process: other users of it too).
    machine_cpu: f64,
    /// Seconds the threads of Ceph's daemons and of the gateway spent runnable but waiting for a
    /// core (/proc/PID/task/*/schedstat).
    ceph_wait: f64,
    gateway_wait: f64,
}

/// Write the whole image sequentially in 4 MiB (one object per write), before every run: the
/// cluster's memstore keeps an object as the list of the buffers written into it, so random
/// 4 KiB writes fragment it and every later write or read of it costs the OSD more. Measured
/// here: `rbd bench` 4 KiB random writes fell from 9.0k to 5.8k, 4.6k, 2.9k IOPS over three
/// successive 30 000-write runs on one image, and random reads after them from ~25k to 6.7k —
/// so a run after another's random writes measured the store's state, not its client. A whole-
/// object write replaces the object's buffers: each run starts on the same store.
fn rewrite(ceph: &Ceph, place: &Placement) -> Result<(), String> {
    let fill = place
        .client("rbd")
        .args(["bench", "--rbd-cache=false", "--io-type", "write", "--io-pattern", "seq", "--io-size", "4M"])
        .args(["--io-threads", "16", "--io-total", &IMAGE_SIZE.to_string(), IMAGE])
        .env("CEPH_CONF", &ceph.conf)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if fill.success() { Ok(()) } else { Err("writing the image whole failed".into()) }
}

/// Seconds the threads of process `pid` have waited on a run queue, summed (schedstat's second
/// field; threads that have ended are not counted).
fn run_queue_wait(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok()?.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// CPU seconds the whole machine has spent busy (/proc/stat: all but idle and iowait).
fn machine_cpu() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = text.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let busy: f64 = f.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    busy / 100.0
}

/// Where the processes run.
struct Placement {
    /// `taskset -c` lists for the cluster and for the rest; none: unpinned.
    cpus: Option<(&'static str, &'static str)>,
}

impl Placement {
    fn describe(&self) -> String {
        match self.cpus {
            Some((c, r)) => format!(
                "Ceph's mon and OSD pinned to CPU {c}; the gateway (riser target with librbd) and its client, and rbd bench \
                 (librbd's own client), pinned to CPU {r} (taskset)"
            ),
            None => "nothing pinned: Ceph's mon and OSD, the gateway, its client and rbd bench share both cores".into(),
        }
    }

    /// Pin every thread of process `pid`, one of the cluster's daemons, to the cluster's CPU (the
    /// gateway and the clients are started on theirs).
    fn pin_to_cluster(&self, pid: u32) -> Result<(), String> {
        let Some((c, _)) = self.cpus else { return Ok(()) };
        crate::bench::taskset(pid, c)
    }

    /// `cmd ARGS`, started on the client's CPU.
    fn client(&self, program: &str) -> Command {
        match self.cpus {
            Some((_, r)) => {
                let mut c = Command::new("taskset");
                c.args(["-c", r, program]);
                c
            }
            None => Command::new(program),
        }
    }
}

struct Bench<'a> {
    ceph: &'a Ceph,
    daemons: Vec<u32>,
    target: &'a RunningTarget,
    examples: &'a std::path::Path,
    place: &'a Placement,
    fio: String,
    runtime: f64,
}

impl Bench<'_> {
    fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/0", self.target.port)
    }

    /// Run `cmd` to completion; its stdout and the CPU times meanwhile (the client's: this
    /// process's waited-for children).
    fn measure(&self, cmd: &mut Command) -> Result<(String, Run), String> {
        let cpu = |pids: &[u32]| pids.iter().map(|p| proc_cpu(&format!("/proc/{p}/stat"), 14)).sum::<f64>();
        let gw = [self.target.child.id()];
        let wait = |pids: &[u32]| pids.iter().map(|&p| run_queue_wait(p)).sum::<f64>();
        let (cw0, gw0) = (wait(&self.daemons), wait(&gw));
        let (c0, g0, k0, m0, t0) = (cpu(&self.daemons), cpu(&gw), proc_cpu("/proc/self/stat", 16), machine_cpu(), Instant::now());
        let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
        let run = Run {
            iops: 0.0,
            wall: t0.elapsed().as_secs_f64(),
            ceph_cpu: cpu(&self.daemons) - c0,
            gateway_cpu: cpu(&gw) - g0,
            client_cpu: proc_cpu("/proc/self/stat", 16) - k0,
            machine_cpu: machine_cpu() - m0,
            ceph_wait: wait(&self.daemons) - cw0,
            gateway_wait: wait(&gw) - gw0,
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!("{:?} failed: {text}{}", cmd.get_args().collect::<Vec<_>>(), String::from_utf8_lossy(&out.stderr)));
        }
        Ok((text, run))
    }

    /// `rbd bench` of `ops` I/Os of workload `w`, no cache, queue depth 16.
    fn rbd_bench(&self, w: Workload, ops: u64) -> Result<Run, String> {
        let mut cmd = self.place.client("rbd");
        cmd.args(["bench", "--rbd-cache=false", "--io-type", if w.writes() { "write" } else { "read" }])
            .args(["--io-pattern", if w.random() { "rand" } else { "seq" }])
            .args(["--io-size", &w.bs.to_string(), "--io-threads", &QD.to_string(), "--io-total", &(ops * w.bs).to_string(), IMAGE])
            .env("CEPH_CONF", &self.ceph.conf);
        let (text, mut run) = self.measure(&mut cmd)?;
        // "elapsed: 6   ops: 10240   ops/sec: 1639.97   bytes/sec: 6.4 MiB/s"
        let line = text.lines().rev().find(|l| l.starts_with("elapsed:")).unwrap_or("");
        let f: Vec<&str> = line.split_whitespace().collect();
        run.iops = f.iter().position(|x| *x == "ops/sec:").and_then(|i| f.get(i + 1)?.parse().ok()).ok_or(format!("rbd bench: {text}"))?;
        Ok(run)
    }

    fn gateway(&self, tool: Tool, w: Workload) -> Result<Run, String> {
        let url = self.url();
        let secs = format!("{}", self.runtime);
        let mut cmd;
        match tool {
            Tool::RbdBench => unreachable!("rbd bench is not a gateway client"),
            Tool::IscsiPerf => {
                cmd = self.place.client("iscsi-perf");
                cmd.args(["-i", "iqn.2026-11.io.riser.test:bench", "-m", &QD.to_string(), "-b", &(w.bs / 512).to_string()])
                    .args(["-t", &format!("{}", self.runtime.ceil() as u64)]);
                if w.random() {
                    cmd.arg("-r");
                }
                cmd.arg(&url);
            }
            Tool::Fio => {
                cmd = self.place.client(&self.fio);
                cmd.args(["--name=bench", "--ioengine=libiscsi", "--initiator=iqn.2026-11.io.riser.test:bench"])
                    .arg(format!("--filename={}", url.replace(':', "\\:")))
                    .arg(format!("--rw={}", w.rw))
                    .arg(format!("--bs={}", w.bs))
                    .arg(format!("--iodepth={QD}"))
                    .arg(format!("--runtime={secs}"))
                    .args(["--time_based=1", "--ramp_time=1", "--output-format=json"]);
            }
            Tool::Initiator => {
                cmd = self.place.client(&self.examples.join("initiator").to_string_lossy());
                cmd.args(["load", &url, "--rw", w.rw, "--block-size", &w.bs.to_string(), "--queue-depth", &QD.to_string()]).args([
                    "--size",
                    &IMAGE_SIZE.to_string(),
                    "--seconds",
                    &secs,
                ]);
            }
        }
        let (text, mut run) = self.measure(&mut cmd)?;
        let parsed = match tool {
            // "... iops average 12345 ..." (progress lines end in \r)
            Tool::IscsiPerf => {
                let t = text.replace('\r', "\n");
                t.rsplit("iops average")
                    .next()
                    .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
                    .filter(|_| t.contains("iops average"))
            }
            Tool::Fio => fio_iops(&text, w.writes()),
            // "load rw=... iops=12345 mib_s=..."
            _ => text.split_whitespace().find_map(|x| x.strip_prefix("iops=")?.parse().ok()),
        };
        run.iops = parsed.ok_or_else(|| format!("{}: no result in {text}", tool.name()))?;
        Ok(run)
    }
}

/// The read or write IOPS of fio's JSON report (its first job).
fn fio_iops(json: &str, writes: bool) -> Option<f64> {
    // The section, not the job option `"rw" : "write"`.
    let key = if writes { "\"write\" : {" } else { "\"read\" : {" };
    let part = &json[json.find(key)?..];
    let at = part.find("\"iops\"")?;
    part[at + 6..].trim_start_matches([' ', ':']).split([',', '\n']).next()?.trim().parse().ok()
}

pub(crate) fn bench_rbd(args: &[String]) -> Result<(), String> {
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let runtime: f64 = arg_value(args, "--runtime").and_then(|r| r.parse().ok()).unwrap_or(5.0);
    let place = match arg_value(args, "--pin").unwrap_or("split") {
        "split" => Placement { cpus: Some(("0", "1")) },
        "none" => Placement { cpus: None },
        other => return Err(format!("--pin {other}: split or none")),
    };
    ensure_ceph()?;
    ensure_packages(&[("iscsi-perf", "libiscsi-bin"), ("taskset", "util-linux")])?;
    let _ = Command::new("bash").arg(shared().join("peers/build-fio-libiscsi.sh")).stdout(std::process::Stdio::null()).status();
    let fio = std::env::var("HOME").map(|h| format!("{h}/.cache/riser/fio-iscsi/bin/fio")).unwrap_or_default();
    let fio = if std::path::Path::new(&fio).exists() { fio } else { return Err("fio with the libiscsi engine is missing".into()) };
    let examples = build_rbd_examples()?;
    let ceph = Ceph::up_at(CEPH_DIR, CEPH_PORT)?;
    let daemons = ceph.daemon_pids();
    for &pid in &daemons {
        place.pin_to_cluster(pid)?;
    }
    ceph.rbd(&["create", "--size", &format!("{}M", IMAGE_SIZE >> 20), IMAGE])?;
    // Every object written once, so reads on both sides find data (not a thin image's holes).
    rewrite(&ceph, &place)?;
    let lun = format!("rbd:{IMAGE},conf={}", ceph.conf.display());
    // Started on its CPU, as an operator pinning a gateway would (systemd's CPUAffinity=): its
    // runtime has a worker per CPU it may use. Pinned only once running, it had two workers
    // taking turns on one CPU.
    let target = RunningTarget::start_on(&examples, &["--target-name", IQN, "--lun", &lun], place.cpus.map(|(_, r)| r))?;
    let b = Bench { ceph: &ceph, daemons, target: &target, examples: &examples, place: &place, fio, runtime };

    println!(
        "== riser gateway (RBD LUN) vs rbd bench straight on librbd: one memstore cluster, librbd cache off on both \
         sides, QD {QD}, {runtime} s runs, median of {reps} (interleaved; ratio: median of each gateway run over the \
         rbd bench run beside it)"
    );
    println!("placement: {}", b.place.describe());
    // rbd bench runs a count of I/Os, not a time: a first short run of each workload sizes the
    // next ones to `runtime` seconds at the rate last measured.
    let mut rate: Vec<f64> = Vec::new();
    for w in WORKLOADS {
        let ops = if w.bs <= 8192 { 8192 } else { 512 };
        rate.push(b.rbd_bench(w, ops)?.iops);
    }
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); TOOLS.len()]; WORKLOADS.len()];
    for rep in 0..reps {
        for (wi, w) in WORKLOADS.into_iter().enumerate() {
            // Each rep starts with another tool, so none always runs first (or last) of its group.
            for ti in (0..TOOLS.len()).map(|i| (i + rep) % TOOLS.len()) {
                let tool = TOOLS[ti];
                if !tool.runs(w) {
                    continue;
                }
                // Every run finds the image as every other did (see `rewrite`).
                rewrite(&ceph, &place)?;
                let r = if tool == Tool::RbdBench {
                    let r = b.rbd_bench(w, ((rate[wi] * runtime) as u64).max(256))?;
                    rate[wi] = r.iops;
                    r
                } else {
                    b.gateway(tool, w)?
                };
                eprintln!("# rep {} {:<9} {:<16} {:>10.1} {}", rep + 1, w.rw, tool.name(), w.value(r.iops), w.unit());
                runs[wi][ti].push(r);
            }
        }
    }
    drop(target);

    print!("\n{:<10} {:>5} {:>3} {:<6} {:>10}", "workload", "bs", "qd", "unit", "rbd bench");
    for t in &TOOLS[1..] {
        print!(" {:>16} {:>6}", t.name(), "ratio");
    }
    println!();
    for (wi, w) in WORKLOADS.into_iter().enumerate() {
        let base = &runs[wi][0];
        let bs = if w.bs >= 1 << 20 { format!("{}M", w.bs >> 20) } else { format!("{}k", w.bs >> 10) };
        print!("{:<10} {bs:>5} {QD:>3} {:<6} {:>10.1}", w.rw, w.unit(), w.value(median(base.iter().map(|r| r.iops).collect())));
        for rs in &runs[wi][1..] {
            if rs.is_empty() {
                print!(" {:>16} {:>6}", "-", "-");
                continue;
            }
            let ratio = median(rs.iter().zip(base).map(|(g, r)| g.iops / r.iops).collect());
            print!(" {:>16.1} {ratio:>5.2}x", w.value(median(rs.iter().map(|r| r.iops).collect())));
        }
        println!();
    }
    println!(
        "\nCPU (medians): cores busy over the run (CPU s / wall s) of Ceph's daemons, the gateway, the client (for rbd \
         bench: rbd bench itself, librbd included), the gateway and client together, and everything else on the machine \
         (other users of it); CPU µs per I/O (busy / IOPS)"
    );
    println!(
        "{:<10} {:<16} {:>6} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9} {:>9}",
        "workload",
        "tool",
        "ceph",
        "gateway",
        "client",
        "gw+cli",
        "others",
        "µs ceph",
        "µs gw",
        "µs cli",
        "µs all",
        "cost",
        "wait ceph",
        "wait gw"
    );
    for (wi, w) in WORKLOADS.into_iter().enumerate() {
        let mut base_cost = f64::NAN;
        for (ti, tool) in TOOLS.into_iter().enumerate() {
            let rs = &runs[wi][ti];
            if rs.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
            let (c, g, k) = (m(&|r| r.ceph_cpu / r.wall), m(&|r| r.gateway_cpu / r.wall), m(&|r| r.client_cpu / r.wall));
            let gk = m(&|r| (r.gateway_cpu + r.client_cpu) / r.wall);
            let others = m(&|r| (r.machine_cpu - r.ceph_cpu - r.gateway_cpu - r.client_cpu).max(0.0) / r.wall);
            let per = |f: &dyn Fn(&Run) -> f64| m(&|r| f(r) / r.wall / r.iops * 1e6);
            let all = per(&|r| r.ceph_cpu + r.gateway_cpu + r.client_cpu);
            if ti == 0 {
                base_cost = all;
            }
            println!(
                "{:<10} {:<16} {c:>6.2} {g:>8.2} {k:>7.2} {gk:>7.2} {others:>7.2} {:>8.1} {:>8.1} {:>8.1} {all:>8.1} {:>5.2}x {:>9.1} {:>9.1}",
                w.rw,
                tool.name(),
                per(&|r| r.ceph_cpu),
                per(&|r| r.gateway_cpu),
                per(&|r| r.client_cpu),
                base_cost / all,
                per(&|r| r.ceph_wait),
                per(&|r| r.gateway_wait)
            );
        }
    }
    println!(
        "(wall times include each tool's start and login: the µs per I/O are slight overestimates, alike on both sides; \
         µs all: Ceph + gateway + client; cost: rbd bench's µs all over this row's, the ratio to expect where the work is \
         CPU-bound on cores it has to itself; wait ceph, wait gw: µs per I/O their threads spent runnable but \
         waiting for a core, the machine's contention)"
    );
    let _ = ceph.rbd(&["rm", "--no-progress", IMAGE]);
    Ok(())
}
