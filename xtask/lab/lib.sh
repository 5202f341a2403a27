# shellcheck shell=bash
# lib.sh - shared functions for the in-guest interop scripts (sourced by matrix.sh).
#
# Runs inside the lab VM (../shared/lab/rdma-lab.sh): the guest's kernel iSCSI stack (open-iscsi +
# iscsi_tcp / ib_iser, LIO + ib_isert) against riser's example target and initiator.
#
# Conventions (as xtask/lab/iwarp-rping.sh): one line per cell, `PASS <cell>: <detail>` or
# `FAIL <cell> (<step>): <why>`, and at the end `N passed, N failed`. Everything else goes to the
# per-step logs under $LAB_LOGS (default /lab/logs: the run dir on the host) and to stderr.
#
# Sections:
#   bookkeeping         lab_init, cell_begin, cell_pass, cell_fail, cell_skip, lab_summary, note
#   resources           rdma_counts [PID], sock_count PID, wait_for CMD..., leftovers_* helpers
#   riser target        riser_target_start NAME LISTEN CMD..., riser_target_stop
#   open-iscsi          iscsid_start, iscsid_stop, kinit_discover, kinit_login, kinit_logout, kinit_dev, kinit_cleanup
#   block-device test   kinit_blocktest (discovery .. leftovers, for one target portal)
#   LIO (configfs)      lio_setup IQN ADDR:PORT tcp|iser [SIZE_MIB], lio_sessions IQN, lio_teardown
#   riser initiator     rinit_verify URL SIZE [CMD...]
# shellcheck disable=SC2034  # variables shared with matrix.sh

LAB_LOGS=${LAB_LOGS:-/lab/logs}
KINIT_IQN=${KINIT_IQN:-iqn.2026-11.io.riser.lab:kernel-initiator}
# MiB the block-device test writes and reads back with O_DIRECT, in DD_BS requests (1M; 4M puts
# several commands in flight at once).
DD_MIB=${DD_MIB:-64}
DD_BS=${DD_BS:-1M}
# How long to wait for a block device, a listen, a teardown (seconds; TCG emulation is slow).
WAIT_DEV=${WAIT_DEV:-60}
WAIT_GONE=${WAIT_GONE:-60}
# Per-command time limits.
T_LOGIN=${T_LOGIN:-120}
T_IO=${T_IO:-600}

LAB_PASS=0
LAB_FAIL=0
LAB_SKIP=0
CELL=""
CELL_T0=0

# ------------------------------------------------------------------------------ bookkeeping

now() { date +%s.%N; }
# secs T0 [T1]: seconds from T0 to T1 (default now), one decimal.
secs() { awk -v a="$1" -v b="${2:-$(now)}" 'BEGIN { printf "%.1f", b - a }'; }
# mibps MIB T0 T1: MiB/s.
mibps() { awk -v m="$1" -v a="$2" -v b="$3" 'BEGIN { d = b - a; if (d <= 0) d = 0.001; printf "%.1f", m / d }'; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
note() { printf '[%s %s] %s\n' "$(uptime_s)" "${CELL:-lab}" "$*" >&2; }

lab_init() {
  mkdir -p "$LAB_LOGS"
  ulimit -l unlimited
  ulimit -c 0
  LAB_T0=$(now)
  note "guest up for $(uptime_s) s when the script started"
  modprobe -a configfs scsi_mod sd_mod 2>/dev/null
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
}

# cell_begin NAME: starts a cell; its logs go to $CELL_LOG (a directory).
cell_begin() {
  CELL=$1
  CELL_T0=$(now)
  CELL_SEQ=$((${CELL_SEQ:-0} + 1))
  CELL_LOG=$LAB_LOGS/$(printf '%02d-%s' "$CELL_SEQ" "${1%% *}")
  TARGET_LOG=""
  mkdir -p "$CELL_LOG"
  STEP_T0=$CELL_T0
  echo "=== $CELL (guest uptime $(uptime_s) s)" >&2
  dmesg -C 2>/dev/null
  if [ "${PCAP:-0}" = 1 ]; then
    tcpdump -i any -s "${PCAP_SNAPLEN:-600}" -w "$CELL_LOG/cell.pcap" ${PCAP_FILTER:-port 3260} > "$CELL_LOG/tcpdump.log" 2>&1 &
    PCAP_PID=$!
    sleep 1
  fi
}

# PCAP=1: every cell's traffic (PCAP_FILTER, default port 3260) in $CELL_LOG/cell.pcap.
PCAP_PID=""
# _pcap_stop: ends a cell's capture; also keeps the cell's kernel log.
_pcap_stop() {
  [ -n "${CELL_LOG:-}" ] && dmesg > "$CELL_LOG/dmesg.txt" 2>/dev/null
  [ -n "$PCAP_PID" ] || return 0
  sleep 0.5
  kill -INT "$PCAP_PID" 2>/dev/null
  wait "$PCAP_PID" 2>/dev/null
  PCAP_PID=""
}

_oneline() { printf '%s' "$*" | tr '\n\t' '  ' | tr -s ' ' | cut -c1-800; }

cell_pass() { # DETAIL
  echo "PASS $CELL: $(_oneline "$1") [cell $(secs "$CELL_T0") s]"
  LAB_PASS=$((LAB_PASS + 1))
  CELL=""
  _pcap_stop
}

cell_fail() { # STEP WHY
  echo "FAIL $CELL ($1): $(_oneline "$2") [cell $(secs "$CELL_T0") s, logs $CELL_LOG]"
  LAB_FAIL=$((LAB_FAIL + 1))
  CELL=""
  _pcap_stop
}

cell_skip() { # WHY
  echo "SKIP $CELL: $(_oneline "$1")"
  LAB_SKIP=$((LAB_SKIP + 1))
  CELL=""
  _pcap_stop
}

lab_summary() {
  note "whole script: $(secs "$LAB_T0") s (guest uptime $(uptime_s) s)"
  [ "$LAB_SKIP" = 0 ] || echo "($LAB_SKIP skipped)"
  echo "$LAB_PASS passed, $LAB_FAIL failed"
  [ "$LAB_FAIL" = 0 ]
}

# tail_log FILE: the last lines of a log, on one line, for a FAIL detail.
tail_log() { [ -s "$1" ] && tail -n "${2:-3}" "$1" | tr '\n' ' '; }

# wait_for SECONDS CMD...: polls CMD every 0.5 s until it succeeds.
wait_for() {
  local t=$1 end
  shift
  end=$(awk -v a="$(now)" -v t="$t" 'BEGIN { printf "%.3f", a + t }')
  while :; do
    "$@" && return 0
    awk -v a="$(now)" -v e="$end" 'BEGIN { exit !(a > e) }' && return 1
    sleep 0.5
  done
}

# ------------------------------------------------------------------------------ resources

# rdma_counts: "qp=N mr=N cm_id=N" from `rdma res show`, all of the guest's (qp and cm_id lines
# start with "link", mr lines with "dev"). Per process there is no reliable count: `rdma res`
# names the *thread* that created an object (a tokio worker, since gone), not its process. The
# guest runs nothing else with RDMA objects, so the guest's totals are the measure.
rdma_counts() {
  local r n out=""
  for r in qp mr cm_id; do
    n=$(rdma res show "$r" 2>/dev/null | grep -cE '^(link|dev) ')
    out="$out $r=$n"
  done
  echo "${out# }"
}

# sock_count PID: open sockets of a process (riser's software RNIC runs every iWARP connection over
# a TCP socket of its own, invisible to `rdma res`: this is how its connections are counted).
sock_count() { find "/proc/$1/fd" -lname 'socket:*' 2>/dev/null | wc -l; }

# res_snapshot [PID]: the resource line compared before and after a cell.
res_snapshot() {
  local s
  s="rdma(all) $(rdma_counts)"
  if [ -n "${1:-}" ]; then s="$s | sockets(pid $1) $(sock_count "$1")"; fi
  echo "$s"
}

# ------------------------------------------------------------------------------ riser target

TARGET_PID=""
TARGET_LOG=""

# _listening PID ADDR:PORT: PID has a TCP listen on ADDR:PORT, or an RDMA CM listen on it (an
# rdma-core provider: on RoCE the listen is no TCP socket).
_listening() {
  local pid=$1 ap=$2
  ss -Hltnp "sport = :${ap##*:}" 2>/dev/null | grep -F "${ap%:*}:${ap##*:}" | grep -q "pid=$pid," && return 0
  # (rdma res names the creating thread, not the process: the listen is matched by address, and
  # the process must be alive.)
  kill -0 "$pid" 2>/dev/null && rdma res show cm_id 2>/dev/null | grep -q "LISTEN.*src-addr ${ap%:*}:${ap##*:}\b"
}

# riser_target_start NAME ADDR:PORT CMD...: starts a target in the background (log in
# $CELL_LOG/NAME.log), waits until it listens on ADDR:PORT. Sets TARGET_PID.
riser_target_start() {
  local name=$1 listen=$2
  shift 2
  TARGET_LOG=$CELL_LOG/$name.log
  note "starting: $*"
  NO_COLOR=1 RUST_LOG=${TARGET_RUST_LOG:-info} "$@" > "$TARGET_LOG" 2>&1 &
  TARGET_PID=$!
  if ! wait_for 60 _listening "$TARGET_PID" "$listen"; then
    if kill -0 "$TARGET_PID" 2>/dev/null; then
      TARGET_ERR="not listening on $listen after 60 s: $(tail_log "$TARGET_LOG")"
      riser_target_stop >/dev/null
    else
      wait "$TARGET_PID"
      TARGET_ERR="exited with $? before listening on $listen: $(tail_log "$TARGET_LOG")"
      TARGET_PID=""
    fi
    return 1
  fi
  note "target pid $TARGET_PID listens on $listen"
}

# riser_target_stop: SIGTERM, then SIGKILL after 15 s. TARGET_EXIT says how it ended.
riser_target_stop() {
  [ -n "$TARGET_PID" ] || return 0
  local t0
  t0=$(now)
  kill -TERM "$TARGET_PID" 2>/dev/null
  if wait_for 15 _gone "$TARGET_PID"; then
    wait "$TARGET_PID"
    TARGET_EXIT="exit $? after SIGTERM in $(secs "$t0") s"
  else
    kill -KILL "$TARGET_PID" 2>/dev/null
    wait "$TARGET_PID"
    TARGET_EXIT="SIGKILLed: SIGTERM ignored for 15 s"
  fi
  TARGET_PID=""
  note "target $TARGET_EXIT; $(grep -c WARN "$TARGET_LOG") warnings in its log"
}
_gone() { ! kill -0 "$1" 2>/dev/null || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

# ------------------------------------------------------------------------------ open-iscsi

ISCSID_PID=""

# iscsid_start: initiator name, a config with timeouts for an emulated guest, iscsid in the
# foreground (its log: $LAB_LOGS/iscsid.N.log).
iscsid_start() {
  modprobe -a iscsi_tcp ib_iser 2>"$LAB_LOGS/modprobe.err" || note "modprobe: $(cat "$LAB_LOGS/modprobe.err")"
  mkdir -p /etc/iscsi /run/lock/iscsi /var/lib/iscsi
  echo "InitiatorName=$KINIT_IQN" > /etc/iscsi/initiatorname.iscsi
  [ -e /etc/iscsi/iscsid.conf ] || cat > /etc/iscsi/iscsid.conf << 'EOF'
node.startup = manual
node.leading_login = No
node.session.timeo.replacement_timeout = 20
node.conn[0].timeo.login_timeout = 30
node.conn[0].timeo.logout_timeout = 20
node.conn[0].timeo.noop_out_interval = 10
node.conn[0].timeo.noop_out_timeout = 30
node.session.err_timeo.abort_timeout = 30
node.session.err_timeo.lu_reset_timeout = 30
node.session.err_timeo.tgt_reset_timeout = 30
node.session.initial_login_retry_max = 2
node.session.cmds_max = 128
node.session.queue_depth = 32
node.session.iscsi.InitialR2T = No
node.session.iscsi.ImmediateData = Yes
node.session.iscsi.FirstBurstLength = 262144
node.session.iscsi.MaxBurstLength = 16776192
node.conn[0].iscsi.MaxRecvDataSegmentLength = 262144
node.conn[0].iscsi.MaxXmitDataSegmentLength = 0
discovery.sendtargets.iscsi.MaxRecvDataSegmentLength = 32768
node.session.nr_sessions = 1
node.session.scan = auto
EOF
  # ISCSID_CONF_EXTRA: more iscsid.conf lines (\n-separated), e.g. "node.session.iscsi.InitialR2T = Yes".
  [ -n "${ISCSID_CONF_EXTRA:-}" ] && ! grep -q '^# extra' /etc/iscsi/iscsid.conf && printf '# extra\n%b\n' "$ISCSID_CONF_EXTRA" >> /etc/iscsi/iscsid.conf
  ISCSID_N=$((${ISCSID_N:-0} + 1))
  # A process group of its own: iscsid's SIGTERM handler signals its whole process group.
  setsid iscsid -f -d "${ISCSID_DEBUG:-1}" > "$LAB_LOGS/iscsid.$ISCSID_N.log" 2>&1 &
  ISCSID_PID=$!
  sleep 1
  kill -0 "$ISCSID_PID" 2>/dev/null || { note "iscsid did not start: $(tail_log "$LAB_LOGS/iscsid.$ISCSID_N.log")"; ISCSID_PID=""; return 1; }
}

iscsid_stop() {
  stop_pid "$ISCSID_PID" 10
  ISCSID_PID=""
}

# stop_pid PID SECONDS: SIGTERM, SIGKILL after SECONDS, reaped (nothing when PID is empty).
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null
  wait_for "$2" _gone "$1" || kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

# kinit_discover ADDR:PORT IFACE IQN: SendTargets; succeeds when IQN is offered. Sets DISC_OUT.
kinit_discover() {
  DISC_OUT=$(timeout "$T_LOGIN" iscsiadm -m discovery -t st -p "$1" -I "$2" 2>&1)
  local rc=$?
  echo "$DISC_OUT" > "$CELL_LOG/discovery.txt"
  [ $rc = 0 ] || { DISC_OUT="rc=$rc: $DISC_OUT"; return 1; }
  echo "$DISC_OUT" | grep -q " $3\$"
}

# kinit_login ADDR:PORT IFACE IQN: logs in to the node record (made by discovery; made here if the
# target offered another address).
kinit_login() {
  iscsiadm -m node -T "$3" -p "$1" -I "$2" > /dev/null 2>&1 \
    || iscsiadm -m node -o new -T "$3" -p "$1" -I "$2" >> "$CELL_LOG/login.txt" 2>&1
  timeout "$T_LOGIN" iscsiadm -m node -T "$3" -p "$1" -I "$2" --login >> "$CELL_LOG/login.txt" 2>&1
}

# kinit_logout ADDR:PORT IFACE IQN
kinit_logout() {
  timeout "$T_LOGIN" iscsiadm -m node -T "$3" -p "$1" -I "$2" --logout >> "$CELL_LOG/logout.txt" 2>&1
}

# kinit_session IQN: the sysfs session directory of IQN's session (empty when none).
kinit_session() {
  local s
  for s in /sys/class/iscsi_session/session*; do
    [ -e "$s/targetname" ] && [ "$(cat "$s/targetname")" = "$1" ] && { echo "$s"; return 0; }
  done
  return 1
}

# kinit_dev IQN: the sdX of LUN 0 of IQN's session, once its block device exists.
kinit_dev() {
  local s b
  s=$(kinit_session "$1") || return 1
  for b in "$s"/device/target*/*:0/block/*; do
    [ -e "$b" ] && [ -b "/dev/${b##*/}" ] && { echo "${b##*/}"; return 0; }
  done
  return 1
}
_has_dev() { kinit_dev "$1" > /dev/null; }

# kinit_cleanup IQN ADDR:PORT IFACE: best effort after a failure: unmount, logout, forget the nodes.
kinit_cleanup() {
  mountpoint -q /mnt/lab && umount -l /mnt/lab
  kinit_session "$1" > /dev/null && { kinit_logout "$2" "$3" "$1" || timeout 60 iscsiadm -m session -u >> "$CELL_LOG/logout.txt" 2>&1; }
  iscsiadm -m node -o delete -T "$1" > /dev/null 2>&1
  iscsiadm -m discoverydb -t st -p "$2" -I "$3" -o delete > /dev/null 2>&1
  true
}

# pattern_file [MIB]: at least MIB (default $DD_MIB) MiB of random data in /tmp (tmpfs).
pattern_file() {
  local want=$((${1:-$DD_MIB} << 20))
  PATTERN=/tmp/lab-pattern.bin
  [ "$(stat -c %s $PATTERN 2>/dev/null || echo 0)" -ge "$want" ] || head -c "$want" /dev/urandom > $PATTERN
}

# dd_roundtrip DEV MIB: O_DIRECT write of the pattern, O_DIRECT read back, compare. Sets
# IO_DETAIL ("write N MiB/s, read N MiB/s") or IO_ERR.
dd_roundtrip() {
  local dev=/dev/$1 mib=$2 t0 t1 t2 sha
  pattern_file "$mib"
  t0=$(now)
  timeout "$T_IO" dd if=$PATTERN of="$dev" bs="$DD_BS" count="${mib}M" iflag=count_bytes oflag=direct status=none 2> "$CELL_LOG/dd-write.err" \
    || { IO_ERR="dd write: $(tail_log "$CELL_LOG/dd-write.err")"; return 1; }
  t1=$(now)
  timeout "$T_IO" dd if="$dev" of=/tmp/lab-readback.bin bs="$DD_BS" count="${mib}M" iflag=direct,count_bytes status=none 2> "$CELL_LOG/dd-read.err" \
    || { IO_ERR="dd read: $(tail_log "$CELL_LOG/dd-read.err")"; return 1; }
  t2=$(now)
  if ! cmp -n $((mib << 20)) $PATTERN /tmp/lab-readback.bin > "$CELL_LOG/cmp.txt" 2>&1; then
    IO_ERR="read back differs: $(tail_log "$CELL_LOG/cmp.txt" 1)"
    return 1
  fi
  sha=$(head -c $((mib << 20)) /tmp/lab-readback.bin | sha256sum | cut -c1-12)
  rm -f /tmp/lab-readback.bin
  IO_DETAIL="$mib MiB O_DIRECT (bs $DD_BS) write $(mibps "$mib" "$t0" "$t1") MiB/s, read $(mibps "$mib" "$t1" "$t2") MiB/s, identical (sha256 $sha)"
}

# step_t LABEL: appends "LABEL <seconds since the last step_t>" to $CELL_LOG/steps.txt.
step_t() {
  local t
  t=$(now)
  echo "$1 $(secs "${STEP_T0:-$CELL_T0}" "$t")" >> "$CELL_LOG/steps.txt"
  STEP_T0=$t
}

# fs_test DEV: mkfs.ext4, mount, files, umount, e2fsck -fn, mount again and check the files.
# (mkfs initialises the inode tables and the journal itself: no ext4lazyinit writing behind the
# test's back.)
fs_test() {
  local dev=/dev/$1 f sums t0
  t0=$(now)
  mkdir -p /mnt/lab
  step_t fs-start
  timeout "$T_IO" mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$dev" > "$CELL_LOG/mkfs.txt" 2>&1 || { FS_ERR="mkfs.ext4: $(tail_log "$CELL_LOG/mkfs.txt")"; return 1; }
  step_t mkfs
  mount -t ext4 "$dev" /mnt/lab 2> "$CELL_LOG/mount.txt" || { FS_ERR="mount: $(tail_log "$CELL_LOG/mount.txt")"; return 1; }
  pattern_file
  cp $PATTERN /mnt/lab/big.bin
  mkdir -p /mnt/lab/small
  for f in $(seq 1 200); do head -c $((f * 97)) $PATTERN > /mnt/lab/small/f$f; done
  sums=$(cd /mnt/lab && find . -type f | sort | xargs sha256sum | sha256sum)
  step_t fs-write
  sync
  step_t fs-sync
  umount /mnt/lab 2> "$CELL_LOG/umount.txt" || { FS_ERR="umount: $(tail_log "$CELL_LOG/umount.txt")"; return 1; }
  step_t umount
  timeout "$T_IO" e2fsck -fn "$dev" > "$CELL_LOG/fsck.txt" 2>&1 || { FS_ERR="e2fsck -fn rc=$?: $(tail_log "$CELL_LOG/fsck.txt")"; return 1; }
  step_t e2fsck
  # The files again, read from the device (the page cache was dropped by the umount).
  mount -t ext4 -o ro "$dev" /mnt/lab 2> "$CELL_LOG/mount.txt" || { FS_ERR="mount ro: $(tail_log "$CELL_LOG/mount.txt")"; return 1; }
  [ "$(cd /mnt/lab && find . -type f | sort | xargs sha256sum | sha256sum)" = "$sums" ] || { umount /mnt/lab; FS_ERR="files differ after remount"; return 1; }
  umount /mnt/lab || { FS_ERR="umount (ro)"; return 1; }
  step_t fs-reread
  FS_DETAIL="ext4: mkfs, 201 files, e2fsck -fn clean, remount+sha256 ok in $(secs "$t0") s"
}

# kinit_leftovers_gone BASELINE PID: no iSCSI session, no sdX, resources as in BASELINE (polled:
# the teardown is asynchronous).
_no_sessions() { ! ls /sys/class/iscsi_session/ 2>/dev/null | grep -q session; }
_res_is() { [ "$(res_snapshot "${2:-}")" = "$1" ]; }
kinit_leftovers() { # BASELINE PID DEV
  local why=""
  wait_for "$WAIT_GONE" _no_sessions || why="$why iSCSI session left: $(ls /sys/class/iscsi_session/ | tr '\n' ' ');"
  [ -n "${3:-}" ] && [ -e "/sys/block/$3" ] && why="$why /dev/$3 still present;"
  iscsiadm -m session > "$CELL_LOG/sessions-after.txt" 2>&1 && why="$why iscsiadm -m session: $(tail_log "$CELL_LOG/sessions-after.txt");"
  wait_for "$WAIT_GONE" _res_is "$1" "${2:-}" || why="$why resources not back: before [$1] after [$(res_snapshot "${2:-}")];"
  LEFT_ERR=${why# }
  [ -z "$why" ]
}

# conn_errors_none: no iSCSI connection error in the kernel log since cell_begin (it clears the
# log). Else CONN_ERR: the count, the kernel's lines about it and the target's warnings.
conn_errors_none() {
  local n
  CONN_ERR=""
  n=$(dmesg | grep -c 'detected conn error')
  [ "$n" = 0 ] && return 0
  CONN_ERR="$n connection error(s) during the cell (the initiator recovered the session): $(dmesg | grep -E 'conn error|TERMINATE|iser_err|iser: |siw: ' | head -n 6 | sed 's/^\[ *[0-9.]*\] //' | tr '\n' ';')"
  [ -n "${TARGET_LOG:-}" ] && [ -s "$TARGET_LOG" ] && CONN_ERR="$CONN_ERR target: $(grep -c WARN "$TARGET_LOG") warnings, first: $(sed 's/\x1b\[[0-9;]*m//g' "$TARGET_LOG" | grep -m1 WARN | cut -c29-)"
  return 1
}

# conn_context: for a FAIL detail, what the kernel saw of the connection ("" when nothing).
conn_context() {
  local io
  io=$(dmesg | grep -c 'I/O error, dev')
  conn_errors_none && [ "$io" = 0 ] && return 0
  conn_errors_none
  printf ' | kernel: %s I/O error(s). %s' "$io" "${CONN_ERR:-}"
}

# ------------------------------------------------------------------------------ block-device test

# kinit_blocktest ADDR:PORT IFACE IQN [TARGET_PID]: the whole kernel-initiator test against one
# target, ending in cell_pass/cell_fail. With TARGET_PID, its rdma resources and sockets are part
# of the before/after comparison.
kinit_blocktest() {
  local portal=$1 iface=$2 iqn=$3 tpid=${4:-} base t0 dev size detail
  base=$(res_snapshot "$tpid")
  note "baseline: $base"
  t0=$(now)
  STEP_T0=$t0
  if ! kinit_discover "$portal" "$iface" "$iqn"; then
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail discovery "$iqn not offered by $portal (-I $iface): $(_oneline "$DISC_OUT")"
    return 1
  fi
  detail="discovery ($(echo "$DISC_OUT" | head -n 1))"
  if ! kinit_login "$portal" "$iface" "$iqn"; then
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail login "$(tail_log "$CELL_LOG/login.txt") | target: $(tail_log "${TARGET_LOG:-/dev/null}" 2)"
    return 1
  fi
  if ! wait_for "$WAIT_DEV" _has_dev "$iqn"; then
    iscsiadm -m session -P3 > "$CELL_LOG/session-P3.txt" 2>&1
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail "block device" "no sdX for LUN 0 after ${WAIT_DEV} s ($(grep -m1 -i 'state' "$CELL_LOG/session-P3.txt"))"
    return 1
  fi
  dev=$(kinit_dev "$iqn")
  iscsiadm -m session -P3 > "$CELL_LOG/session-P3.txt" 2>&1
  size=$(($(cat "/sys/block/$dev/size") / 2048))
  local during
  during=$(res_snapshot "$tpid")
  note "/dev/$dev ($size MiB) after $(secs "$t0") s"
  step_t login
  detail="$detail, login+/dev/$dev ${size} MiB in $(secs "$t0") s"
  if ! dd_roundtrip "$dev" "$DD_MIB"; then
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail "O_DIRECT I/O" "$IO_ERR$(conn_context)"
    return 1
  fi
  note "$IO_DETAIL"
  step_t dd
  if ! fs_test "$dev"; then
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail filesystem "$FS_ERR$(conn_context)"
    return 1
  fi
  t0=$(now)
  if ! kinit_logout "$portal" "$iface" "$iqn"; then
    kinit_cleanup "$iqn" "$portal" "$iface"
    cell_fail logout "$(tail_log "$CELL_LOG/logout.txt")$(conn_context)"
    return 1
  fi
  step_t logout
  iscsiadm -m node -o delete -T "$iqn" > /dev/null 2>&1
  iscsiadm -m discoverydb -t st -p "$portal" -I "$iface" -o delete > /dev/null 2>&1
  if ! kinit_leftovers "$base" "$tpid" "$dev"; then
    cell_fail leftovers "$LEFT_ERR$(conn_context)"
    return 1
  fi
  step_t leftovers
  # Recovered connection failures are failures: the session hid them from the I/O.
  if ! conn_errors_none; then
    cell_fail "connection" "$CONN_ERR"
    return 1
  fi
  cell_pass "$IO_DETAIL; $FS_DETAIL; $detail; logout+cleanup $(secs "$t0") s, no session/sdX left, $(res_snapshot "$tpid") as before (logged in: $during), no connection error"
}

# ------------------------------------------------------------------------------ LIO (configfs)

LIO_C=/sys/kernel/config/target
LIO_CUR=""

# lio_setup IQN ADDR:PORT tcp|iser [SIZE_MIB]: a LIO target with one fileio LUN (in /tmp) and one
# network portal; iser adds ib_isert's RDMA CM listen on it (RoCE only: LIO cannot serve iSER on
# siw, see ../shared/lab/README.md). Open to every initiator (generate_node_acls, no auth).
lio_setup() {
  local iqn=$1 np=$2 mode=$3 mib=${4:-256} tpg
  LIO_CUR=$iqn
  LIO_ERR=""
  modprobe -a target_core_mod iscsi_target_mod target_core_file 2> "$CELL_LOG/lio-modprobe.err" || { LIO_ERR="modprobe: $(tail_log "$CELL_LOG/lio-modprobe.err")"; return 1; }
  if [ "$mode" = iser ]; then modprobe ib_isert 2>> "$CELL_LOG/lio-modprobe.err" || { LIO_ERR="modprobe ib_isert"; return 1; }; fi
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
  rm -f /tmp/lio-lab.img
  truncate -s "${mib}M" /tmp/lio-lab.img
  mkdir -p $LIO_C/core/fileio_9/lab || { LIO_ERR="mkdir backstore"; return 1; }
  echo "fd_dev_name=/tmp/lio-lab.img,fd_dev_size=$((mib << 20))" > $LIO_C/core/fileio_9/lab/control || { LIO_ERR="backstore control"; return 1; }
  echo 1 > $LIO_C/core/fileio_9/lab/enable || { LIO_ERR="backstore enable"; return 1; }
  tpg=$LIO_C/iscsi/$iqn/tpgt_1
  mkdir -p "$tpg/lun/lun_0" || { LIO_ERR="mkdir tpgt_1/lun_0"; return 1; }
  ln -s $LIO_C/core/fileio_9/lab "$tpg/lun/lun_0/lab" || { LIO_ERR="LUN link"; return 1; }
  mkdir "$tpg/np/$np" 2> "$CELL_LOG/lio-np.err" || { LIO_ERR="network portal $np: $(tail_log "$CELL_LOG/lio-np.err") $(dmesg | tail -n 2)"; return 1; }
  if [ "$mode" = iser ]; then
    echo 1 > "$tpg/np/$np/iser" 2> "$CELL_LOG/lio-np.err" || { LIO_ERR="iser on $np: $(tail_log "$CELL_LOG/lio-np.err") $(dmesg | grep -i isert | tail -n 2)"; return 1; }
  fi
  local a
  for a in generate_node_acls:1 authentication:0 demo_mode_write_protect:0 cache_dynamic_acls:1; do
    echo "${a#*:}" > "$tpg/attrib/${a%%:*}" || { LIO_ERR="attrib ${a%%:*}"; return 1; }
  done
  echo 1 > "$tpg/enable" || { LIO_ERR="tpg enable"; return 1; }
  note "LIO $iqn on $np ($mode), fileio ${mib} MiB"
}

# lio_sessions IQN: the initiators logged in to IQN (empty when none).
lio_sessions() { cat "$LIO_C/iscsi/$1/tpgt_1/dynamic_sessions" 2>/dev/null | tr -d '\0' | grep -v '^$'; }
_lio_idle() { [ -z "$(lio_sessions "$1")" ]; }

# lio_teardown: removes what lio_setup made, in reverse (best effort; an error names what stayed).
lio_teardown() {
  local iqn=${1:-$LIO_CUR} tpg np
  [ -n "$iqn" ] || return 0
  tpg=$LIO_C/iscsi/$iqn/tpgt_1
  if [ -d "$tpg" ]; then
    echo 0 > "$tpg/enable" 2>/dev/null
    for np in "$tpg"/np/*; do
      [ -d "$np" ] || continue
      [ "$(cat "$np/iser" 2>/dev/null)" = 1 ] && echo 0 > "$np/iser"
      rmdir "$np"
    done
    rm -f "$tpg"/lun/lun_0/lab
    rmdir "$tpg/lun/lun_0" "$tpg" "$LIO_C/iscsi/$iqn" 2>/dev/null
  fi
  [ -d $LIO_C/core/fileio_9/lab ] && rmdir $LIO_C/core/fileio_9/lab
  [ -d $LIO_C/core/fileio_9 ] && rmdir $LIO_C/core/fileio_9
  rm -f /tmp/lio-lab.img
  LIO_CUR=""
  [ ! -e "$LIO_C/iscsi/$iqn" ] && [ ! -e $LIO_C/core/fileio_9 ]
}

# ------------------------------------------------------------------------------ riser initiator

# rinit_verify URL SIZE CMD...: CMD verify URL --size SIZE (riser's example initiator: seeded
# pattern written, read back and compared). Sets RINIT_DETAIL or RINIT_ERR.
rinit_verify() {
  local url=$1 size=$2 rc
  shift 2
  note "$* verify $url --size $size"
  timeout "${T_RINIT:-$T_IO}" "$@" verify "$url" --size "$size" > "$CELL_LOG/rinit-verify.txt" 2>&1
  rc=$?
  if [ $rc != 0 ] || ! grep -q 'verified' "$CELL_LOG/rinit-verify.txt"; then
    RINIT_ERR="rc=$rc: $(tail_log "$CELL_LOG/rinit-verify.txt")"
    return 1
  fi
  RINIT_DETAIL="$(grep -h '^wrote\|^read' "$CELL_LOG/rinit-verify.txt" | tr '\n' ';' | sed 's/;$//; s/;/, /g')"
}
