//! The body of `EVALUATION.md`: machine and method, then one part per section of the run, each
//! with its tables (medians of the runs) and figures, then the caveats.

use super::{Spread, Table, by_rep, median, num, size_name};
use std::fmt::Write as _;
use std::path::Path;

type Row<'a> = &'a std::collections::BTreeMap<String, String>;

fn med(rows: &[Row<'_>], col: &str) -> f64 {
    median(rows.iter().map(|r| num(r, col)).collect())
}

pub(super) fn write_sections(dir: &Path, fig: &dyn Fn(&str, &str) -> String) -> Result<String, String> {
    let mut md = String::new();
    let reps = ["throughput.csv", "iops.csv", "peers.csv"]
        .iter()
        .filter_map(|f| Table::read(dir, f).ok().flatten())
        .map(|t| t.distinct("rep").len())
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        md,
        "\n## Machine and method\n\n\
         - One host, everything over loopback (127.0.0.1): target and initiator are separate processes; \
         the machine is shared and noisy (±30 % between runs), so every figure is a median of {reps} \
         repetition(s), and every comparison is between runs interleaved in the same session (A, B, A, B, …), \
         stated as the median of the per-repetition ratios with their minimum and maximum.\n\
         - LUNs live in memory: riser's RAM store (1 GiB), tgtd's file on /dev/shm (1 GiB), each written \
         once before measuring.\n\
         - riser's negotiated defaults: MaxRecvDataSegmentLength 256 KiB, MaxBurstLength 1 MiB, \
         FirstBurstLength 256 KiB, ImmediateData=Yes, InitialR2T=No, no digests. tgtd is raised to \
         the same (its defaults are 8 KiB / 256 KiB / 64 KiB, InitialR2T=Yes). The paper's set: \
         MaxRecvDataSegmentLength = MaxBurstLength = 512 KiB.\n\
         - iSER here runs on riser's software iWARP RNIC (MPA/DDP/RDMAP in user space over loopback \
         TCP): it shows iSER's protocol costs, not RDMA offload. `--lab` adds the kernel's rxe and siw.\n\
         - CPU: user + system seconds of the target process and of the client process (/proc, 10 ms \
         ticks) over the bytes moved: the sum over all repetitions of a point over the sum of their bytes. \
         The clients' CPU includes their start and login, so it is slightly overstated for short runs, for \
         every target alike.\n\
         - Clients: the riser example initiator (`read`/`write` for fixed volumes, `load` for \
         timed runs with an HdrHistogram of latencies), fio 3.33 with the libiscsi engine, \
         libiscsi's iscsi-perf.\n"
    );

    if let Some(t) = Table::read(dir, "throughput.csv")? {
        let ceiling = med(&t.rows.iter().collect::<Vec<_>>(), "ceiling_mib_s");
        let _ = writeln!(
            md,
            "## 1. Throughput against transfer size (the paper's Figures 2–5)\n\n\
             Payload MiB/s of reads and writes, 1 KiB … 16 MiB, one command outstanding as in the paper \
             and eight; riser iSCSI/TCP against riser iSER, riser's parameters and the paper's. The \
             dashed line is one TCP stream over loopback (iperf3, 1 MiB writes, {ceiling:.0} MiB/s in \
             this run): the share of it is how the paper states its results (of 10GigE's payload maximum).\n"
        );
        for (op, qd) in [("read", "1"), ("write", "1"), ("read", "8"), ("write", "8")] {
            md.push_str(&fig(&format!("throughput-{op}-qd{qd}"), &format!("{op}s at QD {qd}")));
        }
        md.push_str("| op | QD | size | TCP MiB/s | share | iSER MiB/s | share | iSER / TCP | TCP, paper's set | iSER, paper's set |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for op in ["read", "write"] {
            for qd in ["1", "8"] {
                for size in [4096u64, 65536, 512 << 10, 1 << 20, 16 << 20] {
                    let get = |set: &str, tr: &str| {
                        t.select(&[("params", set), ("transport", tr), ("op", op), ("queue_depth", qd), ("io_bytes", &size.to_string())])
                    };
                    let (tcp, iser) = (get("defaults", "tcp"), get("defaults", "iser"));
                    if tcp.is_empty() {
                        continue;
                    }
                    let ratio = Spread::of_ratios(&by_rep(&iser, "mib_s"), &by_rep(&tcp, "mib_s")).median;
                    let (a, b) = (med(&tcp, "mib_s"), med(&iser, "mib_s"));
                    let _ = writeln!(
                        md,
                        "| {op} | {qd} | {} | {a:.0} | {:.0} % | {b:.0} | {:.0} % | {ratio:.2}× | {:.0} | {:.0} |",
                        size_name(size),
                        100.0 * a / ceiling,
                        100.0 * b / ceiling,
                        med(&get("paper", "tcp"), "mib_s"),
                        med(&get("paper", "iser"), "mib_s")
                    );
                }
            }
        }
        md.push_str("\nEvery size and run is in `throughput.csv`.\n\n");
    }

    if let Some(t) = Table::read(dir, "iops.csv")? {
        md.push_str(
            "## 2. IOPS and latency\n\nRandom reads and writes at one command outstanding and at 32, riser \
             initiator ↔ riser target. Latency is issue to status as the initiator sees it (HdrHistogram, 3 \
             significant digits).\n\n",
        );
        md.push_str(&fig("iops-randread", "random-read IOPS"));
        md.push_str(&fig("iops-randwrite", "random-write IOPS"));
        md.push_str(&fig("latency-cdf-4k", "latency distribution, 4 KiB at QD 1"));
        md.push_str("| rw | size | QD | TCP IOPS | iSER IOPS | iSER / TCP | TCP p50 / p99 / p99.9 µs | iSER p50 / p99 / p99.9 µs |\n|---|---:|---:|---:|---:|---:|---|---|\n");
        for rw in t.distinct("rw") {
            let mut sizes: Vec<u64> = t.distinct("io_bytes").iter().filter_map(|s| s.parse().ok()).collect();
            sizes.sort_unstable();
            for size in sizes {
                for qd in t.distinct("queue_depth") {
                    let get = |tr: &str| t.select(&[("transport", tr), ("rw", &rw), ("io_bytes", &size.to_string()), ("queue_depth", &qd)]);
                    let (tcp, iser) = (get("tcp"), get("iser"));
                    let lat = |r: &[Row<'_>]| format!("{:.0} / {:.0} / {:.0}", med(r, "p50_us"), med(r, "p99_us"), med(r, "p999_us"));
                    let ratio = Spread::of_ratios(&by_rep(&iser, "iops"), &by_rep(&tcp, "iops")).median;
                    let _ = writeln!(
                        md,
                        "| {rw} | {} | {qd} | {:.0} | {:.0} | {ratio:.2}× | {} | {} |",
                        size_name(size),
                        med(&tcp, "iops"),
                        med(&iser, "iops"),
                        lat(&tcp),
                        lat(&iser)
                    );
                }
            }
        }
        md.push('\n');
    }

    if let Some(t) = Table::read(dir, "throughput.csv")? {
        md.push_str(
            "## 3. CPU cost\n\nCPU seconds per GiB moved (user + system), the target and the initiator process \
             separately, QD 8 with riser's parameters; CPU % is of one core over the run.\n\n",
        );
        md.push_str(&fig("cpu-per-gib-read", "CPU per GiB, reads"));
        md.push_str(&fig("cpu-per-gib-write", "CPU per GiB, writes"));
        md.push_str("| op | size | TCP target s/GiB | TCP initiator s/GiB | iSER target s/GiB | iSER initiator s/GiB | TCP target CPU % | iSER target CPU % |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for op in ["read", "write"] {
            for size in [4096u64, 65536, 512 << 10, 1 << 20, 16 << 20] {
                let rows = |tr: &str| t.select(&[("params", "defaults"), ("transport", tr), ("op", op), ("queue_depth", "8")]);
                let (tcp, iser) = (rows("tcp"), rows("iser"));
                let c = |rows: &[Row<'_>], col| super::throughput::cpu_per_gib(rows, size, col);
                // CPU % = CPU s per GiB × GiB per s.
                let pct = |rows: &[Row<'_>]| {
                    let r: Vec<_> = rows.iter().copied().filter(|r| num(r, "io_bytes") as u64 == size).collect();
                    100.0 * c(rows, "target_cpu_s") * med(&r, "mib_s") / 1024.0
                };
                if c(&tcp, "target_cpu_s").is_nan() {
                    continue;
                }
                let _ = writeln!(
                    md,
                    "| {op} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} % | {:.0} % |",
                    size_name(size),
                    c(&tcp, "target_cpu_s"),
                    c(&tcp, "initiator_cpu_s"),
                    c(&iser, "target_cpu_s"),
                    c(&iser, "initiator_cpu_s"),
                    pct(&tcp),
                    pct(&iser)
                );
            }
        }
        md.push('\n');
    }

    if let Some(t) = Table::read(dir, "peers.csv")? {
        md.push_str(
            "## 4. Against peers: tgtd and libiscsi, same clients, same run\n\nThe riser target and tgtd 1.0.85 \
             (limits raised to riser's defaults) measured by the same three clients, and the riser initiator \
             against fio's libiscsi engine on the same target. Value: MiB/s (IOPS for 4 KiB); ratio: \
             median of the per-repetition ratios (min–max).\n\n",
        );
        md.push_str(&fig("peers-target", "riser target over tgtd"));
        md.push_str(&fig("peers-initiator", "riser initiator over libiscsi"));
        md.push_str(
            "| workload | client | riser target | tgtd | riser / tgtd | target CPU s/GiB riser / tgtd |\n|---|---|---:|---:|---:|---:|\n",
        );
        for w in super::peers::present(&t) {
            let unit = if w.1 <= 8192 { "iops" } else { "mib_s" };
            for c in ["fio-libiscsi", "iscsi-perf", "riser-initiator"] {
                let (r, g) = (super::peers::values(&t, "riser", c, w, unit), super::peers::values(&t, "tgtd", c, w, unit));
                if r.is_empty() {
                    continue;
                }
                let cpu = |target: &str| super::peers::cpu_per_gib(&t, target, c, w, "target_cpu_s");
                let s = Spread::of_ratios(&r, &g);
                let _ = writeln!(
                    md,
                    "| {} | {c} | {:.0} | {:.0} | {:.2}× ({:.2}–{:.2}) | {:.2} / {:.2} |",
                    super::peers::workload_name(w.0, w.1, w.2),
                    median(r),
                    median(g),
                    s.median,
                    s.min,
                    s.max,
                    cpu("riser"),
                    cpu("tgtd")
                );
            }
        }
        md.push_str("\n| workload | target | riser initiator | fio-libiscsi | riser / libiscsi | client CPU s/GiB riser / fio |\n|---|---|---:|---:|---:|---:|\n");
        for w in super::peers::present(&t) {
            let unit = if w.1 <= 8192 { "iops" } else { "mib_s" };
            for target in ["riser", "tgtd"] {
                let (r, f) = (
                    super::peers::values(&t, target, "riser-initiator", w, unit),
                    super::peers::values(&t, target, "fio-libiscsi", w, unit),
                );
                if f.is_empty() {
                    continue;
                }
                let cpu = |c: &str| super::peers::cpu_per_gib(&t, target, c, w, "client_cpu_s");
                let s = Spread::of_ratios(&r, &f);
                let _ = writeln!(
                    md,
                    "| {} | {target} | {:.0} | {:.0} | {:.2}× ({:.2}–{:.2}) | {:.2} / {:.2} |",
                    super::peers::workload_name(w.0, w.1, w.2),
                    median(r),
                    median(f),
                    s.median,
                    s.min,
                    s.max,
                    cpu("riser-initiator"),
                    cpu("fio-libiscsi")
                );
            }
        }
        md.push('\n');
    }

    md.push_str("## 5. In the lab VM: rxe and siw, riser's and the kernel's initiator\n\n");
    match super::lab::table(dir)? {
        Some(table) => {
            md.push_str(
                "The riser target on the rdma-core provider inside the lab VM (../shared/lab), its iSER portal on \
                 the link and a TCP portal beside it; the riser initiator (rdma-core) and the Linux kernel's \
                 (open-iscsi with ib_iser or iscsi_tcp, O_DIRECT dd, one 1 MiB request at a time). The VM runs under \
                 TCG emulation: absolute figures are meaningless, only the ratios between runs of the same session \
                 say something.\n\n",
            );
            md.push_str(&table);
            md.push('\n');
        }
        None => md.push_str("Not measured in this run (`cargo xtask evaluate --lab`).\n\n"),
    }

    if let Some(t) = Table::read(dir, "sweep.csv")? {
        md.push_str(
            "## 6. Parameter sweep\n\nOne setting changed from riser's defaults at a time, offered by both sides; \
             1 MiB sequential writes at QD 8 and 4 KiB random reads at QD 32. Every setting has a target of its own, \
             all up at once, and each repetition goes round all of them; \"vs defaults\" is the median of each \
             run's ratio to the defaults' run of the same round (min–max).\n\n",
        );
        md.push_str(&fig("sweep-write-1m", "sweep, 1 MiB writes"));
        md.push_str(&fig("sweep-randread-4k", "sweep, 4 KiB random reads"));
        md.push_str(
            "| transport | setting | write 1M QD 8 MiB/s | vs defaults | randread 4K QD 32 IOPS | vs defaults |\n|---|---|---:|---:|---:|---:|\n",
        );
        let [(w, ..), (r, ..)] = super::sweep::WORKLOADS;
        let change =
            |s: Spread| format!("{:+.0} % ({:+.0}…{:+.0})", 100.0 * (s.median - 1.0), 100.0 * (s.min - 1.0), 100.0 * (s.max - 1.0));
        for transport in ["tcp", "iser"] {
            let (dw, dr) = (super::sweep::runs(&t, transport, "defaults", w), super::sweep::runs(&t, transport, "defaults", r));
            for setting in t.distinct("setting") {
                let (vw, vr) = (super::sweep::runs(&t, transport, &setting, w), super::sweep::runs(&t, transport, &setting, r));
                if vw.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    md,
                    "| {transport} | {setting} | {:.0} | {} | {:.0} | {} |",
                    median(vw.clone()),
                    change(Spread::of_ratios(&vw, &dw)),
                    median(vr.clone()),
                    change(Spread::of_ratios(&vr, &dr))
                );
            }
        }
        md.push_str("\nA change whose runs do not all lie on one side of the defaults' is no evidence for changing them.\n\n");
    }

    if let Some(t) = Table::read(dir, "micro.csv")? {
        md.push_str("## 7. Micro-benchmarks (criterion)\n\n| benchmark | median time | rate |\n|---|---:|---:|\n");
        for r in &t.rows {
            let ns = num(r, "median_ns");
            let time = if ns >= 1000.0 { format!("{:.2} µs", ns / 1000.0) } else { format!("{ns:.1} ns") };
            let rate = num(r, "rate");
            let rate = if rate >= 10.0 { format!("{rate:.0}") } else { format!("{rate:.3}") };
            let _ = writeln!(
                md,
                "| `{}` | {time} | {rate} {} |",
                r.get("bench").map_or("", String::as_str),
                r.get("unit").map_or("", String::as_str)
            );
        }
        md.push('\n');
    }

    let analysis = super::super::root().join("docs/evaluation-analysis.md");
    if let Ok(text) = std::fs::read_to_string(&analysis) {
        md.push_str("## Analysis of the misses\n\n(from `docs/evaluation-analysis.md`, written by hand after the run it cites)\n\n");
        md.push_str(&text);
        md.push('\n');
    }
    md.push_str(
        "## Caveats\n\n\
         - A software RNIC shows iSER's protocol costs (framing, memory registration, completions), not \
         hardware offload: on a real RNIC, RDMA Write and Read move data without either CPU copying it.\n\
         - Loopback is not a wire: there is no NIC, no wire latency, and both ends share the same two cores, \
         so every transport here competes with its peer for CPU.\n\
         - A shared 2-core VM is noisy (±30 % between runs): read ratios from interleaved runs, not absolute \
         figures across runs. The lab VM is emulated (TCG): its figures are for ratios only.\n",
    );
    Ok(md)
}
