#!/usr/bin/env bash
# bench-vm.sh: the RDMA transport against perftest, in ONE Soft-RoCE VM boot.
# Runs inside the VM (it checks RDMA_VM); from the repository root:
#
#   cargo build --release -p colibri-cli
#   ../shared/rdma-vm/run.sh --net lo --timeout 1800 -- net/bulk_rdma/bench-vm.sh [ROUNDS] [MODE]
#
# MODE is colibri's engine mode: polling (default; the engine spins 1 ms
# before it sleeps) or blocking. COLIBRI names the colibri binary
# (default target/release/colibri). With EAGER_OFF=1, every round also
# runs it with the eager path turned off (COLIBRI_RDMA_EAGER_SLOTS=0: the
# protocol before the eager path, every frame on TCP and every message
# READ), interleaved, and the summary shows both against the same
# perftest figures. With SHARED=1, every round also runs it with both
# domains on one shared engine thread (`--engine-threads 1`: RdmaEngine),
# likewise. BEFORE=path runs another colibri binary (say, the previous
# build) in every round too, for before/after figures of one boot.
# Each round runs ib_write_bw and ib_read_bw (1 MiB, two processes, TCP
# exchange on 127.0.0.1) and ib_send_lat (64 B), then
# `colibri bench --xprt rdma` (64 B message round trip, 1 MiB active GET and
# PUT); rounds are interleaved so both see the same
# conditions. Prints the medians and the ratios against the issue's
# targets: GET (passive WRITEs) >= 0.9 x ib_write_bw, PUT (passive READs)
# >= 0.9 x ib_read_bw, round trip <= 1.5 x (2 x ib_send_lat typical).
set -euo pipefail
[[ -n "${RDMA_VM:-}" ]] || { echo "bench-vm.sh: run me inside the VM (../shared/rdma-vm/run.sh --net lo -- $0)" >&2; exit 2; }
ROUNDS=${1:-3}
MODE=${2:-polling}
DEV=${RDMA_VM_DEVICE:-rxe0}
G=${RDMA_VM_GID_INDEX:-1}
BIN=${COLIBRI:-target/release/colibri}
L=$(mktemp -d /tmp/rdmabench.XXXX)
mkfifo "$L/tick"
exec {TICK}<>"$L/tick"

# Wait for a TCP listener on port $1 with bash builtins only (an exec costs
# 0.1-0.5 s under emulation).
waitport() {
    local hex i l
    printf -v hex ':%04X ' "$1"
    for ((i = 0; i < 500; i++)); do
        while read -r l; do [[ "$l" == *"$hex"*" 0A "* ]] && return 0; done </proc/net/tcp
        read -t 0.02 -u "$TICK" _ || true
    done
    return 1
}

P=19100
# perftest TOOL SIZE ITERS FIELD: prints the FIELD-th column of the result line.
perftest() {
    local tool=$1 size=$2 iters=$3 field=$4
    P=$((P + 1))
    timeout 300 "$tool" -d "$DEV" -x "$G" -p "$P" -s "$size" -n "$iters" -F >"$L/s" 2>&1 &
    local sp=$!
    waitport "$P" || true
    timeout 300 "$tool" -d "$DEV" -x "$G" -p "$P" -s "$size" -n "$iters" -F 127.0.0.1 >"$L/c" 2>&1 || true
    wait "$sp" || true
    awk -v f="$field" '/^ *#bytes/ {getline; print $f; exit}' "$L/c"
}

for ((r = 1; r <= ROUNDS; r++)); do
    w=$(perftest ib_write_bw 1048576 300 4)
    rd=$(perftest ib_read_bw 1048576 300 4)
    lat=$(perftest ib_send_lat 64 5000 5)
    echo "round $r perftest: ib_write_bw ${w:-?} MB/s, ib_read_bw ${rd:-?} MB/s, ib_send_lat typical ${lat:-?} us" >&2
    echo "$w $rd $lat" >>"$L/perf"
    "$BIN" bench --xprt rdma --mode "$MODE" --tests rtt,bulk --sizes 64 --bulk-sizes 1M \
        --iters 2000 --bulk-bytes 64M --runs 1 --no-pin --json --quiet >"$L/colibri-$r.json"
    if [[ -n "${BEFORE:-}" ]]; then
        "$BEFORE" bench --xprt rdma --mode "$MODE" --tests rtt,bulk --sizes 64 --bulk-sizes 1M \
            --iters 2000 --bulk-bytes 64M --runs 1 --no-pin --json --quiet >"$L/before-$r.json"
    fi
    if [[ -n "${SHARED:-}" ]]; then
        "$BIN" bench --xprt rdma --mode "$MODE" --tests rtt,bulk --sizes 64 --bulk-sizes 1M \
            --iters 2000 --bulk-bytes 64M --runs 1 --no-pin --engine-threads 1 --json --quiet >"$L/shared-$r.json"
    fi
    if [[ -n "${EAGER_OFF:-}" ]]; then
        COLIBRI_RDMA_EAGER_SLOTS=0 "$BIN" bench --xprt rdma --mode "$MODE" --tests rtt,bulk --sizes 64 --bulk-sizes 1M \
            --iters 2000 --bulk-bytes 64M --runs 1 --no-pin --json --quiet >"$L/eager-off-$r.json"
    fi
done

python3 - "$L" "$ROUNDS" "$MODE" <<'EOF'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
perf = [l.split() for l in open(f"{d}/perf") if l.strip()]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
def num(s):
    try:
        v = float(s)
        return v if v == v and v != float("inf") else None
    except ValueError:
        return None
wbw = med([num(p[0]) for p in perf if len(p) > 0])
rbw = med([num(p[1]) for p in perf if len(p) > 1])
lat = med([num(p[2]) for p in perf if len(p) > 2])
import os
def figures(prefix):
    ours = {"rtt": [], "bulk-read": [], "bulk-write": []}
    for r in range(1, rounds + 1):
        try:
            rep = json.load(open(f"{d}/{prefix}-{r}.json"))
        except (OSError, ValueError):
            continue
        for s in rep["sections"]:
            for row in s["rows"]:
                if row["test"] in ours:
                    ours[row["test"]].append(row["ours"]["median"])
    per = " / ".join(f"{x:.1f}" for x in ours["rtt"])
    print(f"{prefix}: per round rtt us {per}; GET MB/s "
          + " / ".join(f"{x * 1000:.1f}" for x in ours["bulk-read"]) + "; PUT MB/s "
          + " / ".join(f"{x * 1000:.1f}" for x in ours["bulk-write"]))
    # GB/s -> MB/s
    return med(ours["rtt"]), med(ours["bulk-read"]) * 1000, med(ours["bulk-write"]) * 1000
def line(name, o, b, ratio, target, ok):
    print(f"{name:34} {o:>10.2f} {b:>10.2f} {ratio:>7.3f}  {target} {'met' if ok else 'MISSED'}")
print(f"rounds {rounds}; medians; MB/s = 10^6 B/s; colibri mode {sys.argv[3]}")
for prefix in ["colibri"] + [p for p in ["shared", "before", "eager-off"] if os.path.exists(f"{d}/{p}-1.json")]:
    rtt, get, put = figures(prefix)
    print(f"{'test (' + prefix + ')':34} {'ours':>10} {'baseline':>10} {'ratio':>7}  target")
    line("1 MiB GET MB/s vs ib_write_bw", get, wbw, get / wbw, ">= 0.9", get / wbw >= 0.9)
    line("1 MiB PUT MB/s vs ib_read_bw", put, rbw, put / rbw, ">= 0.9", put / rbw >= 0.9)
    line("64 B round trip us vs 2 x send_lat", rtt, 2 * lat, rtt / (2 * lat), "<= 1.5", rtt / (2 * lat) <= 1.5)
EOF
