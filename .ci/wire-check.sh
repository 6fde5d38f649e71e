#!/usr/bin/env bash
# An independent decoder reads our socket LND wire: Wireshark's LNet
# dissector (tshark) decodes the traffic of `colibri serve`/`colibri ping
# --xprt lnet` (messages and 1 MiB bulk through transfer machines) and of
# two `colibri lnet run` nodes (LNet pings, discovery), captured on the
# loopback interface. Every LNet frame it finds must decode as Lustre's:
# a 24-byte ksock_msg of type NOOP or LNET, then a 72-byte lnet_hdr of a
# known type between socket LND (tcp) NIDs on 127/8, with the frame as
# long as the header says. Needs tcpdump, tshark and root (capture).
#
# Usage: .ci/wire-check.sh [path/to/colibri]
set -euo pipefail

colibri=$(realpath "${1:-target/release/colibri}")
work=$(mktemp -d)
pids=()
cleanup() {
    # Quietly: the shell reports each child it reaps killed.
    exec 2>/dev/null
    for p in "${pids[@]}"; do kill -9 "$p" || true; done
    wait || true
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "wire-check: $*" >&2
    exit 1
}

# One capture of the workload into $pcap, with every process it started
# stopped afterwards.
capture() {
    pids=()
    rm -f "$pcap" "$work"/*.sock
    tcpdump -i lo --immediate-mode -U -B 131072 -s 0 -w "$pcap" "tcp port 7988 or tcp port $port" 2>"$work/tcpdump.err" &
    dump=$!
    pids+=("$dump")
    for _ in $(seq 100); do
        grep -q "listening on" "$work/tcpdump.err" && break
        sleep 0.05
    done
    grep -q "listening on" "$work/tcpdump.err" || fail "tcpdump did not start: $(cat "$work/tcpdump.err")"

    # Transfer machines: a server process and two client processes.
    server=127.0.0.9@tcp:12345:30:1
    "$colibri" serve --xprt lnet --listen "$server" --duration 30 2>"$work/serve.err" &
    pids+=("$!")
    for _ in $(seq 100); do
        grep -q "^serving" "$work/serve.err" && break
        sleep 0.05
    done
    grep -q "^serving" "$work/serve.err" || fail "colibri serve did not start: $(cat "$work/serve.err")"
    "$colibri" ping --xprt lnet -c 5 -s 64 -i 0 -q "$server" >/dev/null
    "$colibri" ping --xprt lnet --bulk -c 2 -s 1M -i 0 -q "$server" >/dev/null

    # Two LNet nodes: pings both ways (GET/REPLY) and discovery (PUT/ACK).
    for i in 10 11; do
        printf 'net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.0.%s@tcp\nglobal:\n    accept_port: %s\n    accept: all\n' \
            "$i" "$port" >"$work/n$i.yaml"
        "$colibri" lnet run --config "$work/n$i.yaml" --ctl "$work/n$i.sock" >"$work/n$i.out" 2>&1 &
        pids+=("$!")
    done
    for i in 10 11; do
        for _ in $(seq 100); do
            [ -S "$work/n$i.sock" ] && break
            sleep 0.05
        done
    done
    "$colibri" lnet --ctl "$work/n10.sock" ping 127.0.0.11@tcp >/dev/null
    "$colibri" lnet --ctl "$work/n11.sock" ping 127.0.0.10@tcp >/dev/null
    "$colibri" lnet --ctl "$work/n10.sock" discover 127.0.0.11@tcp >/dev/null
    # Let tcpdump write out what it holds (the size of the file settles).
    last=-1
    for _ in $(seq 100); do
        sleep 0.2
        now=$(stat -c %s "$pcap")
        [ "$now" = "$last" ] && break
        last=$now
    done
    kill -INT "$dump"
    wait "$dump" 2>/dev/null || true
    # SIGINT first (they stop at Ctrl-C; the shell reports a child
    # killed by another signal), SIGKILL for any still there a second on.
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for _ in $(seq 20); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.05
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}

# The transport's nodes listen on port 7988; two `lnet run` nodes on a
# free one.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pcap="$work/wire.pcap"
# `lustre` off: portal 30, the transport's default, is also one of
# Lustre's services, whose dissector would try our payloads as its RPCs.
decode=(tshark -n -r "$pcap" --disable-protocol lustre
    -d "tcp.port==7988,lnet" -d "tcp.port==$port,lnet")
# tcpdump on a busy machine now and then misses a segment of a 1 MiB
# burst (then nothing after it in that stream can be reassembled): such a
# capture is taken again, up to three times.
for attempt in 1 2 3; do
    capture
    lost=$("${decode[@]}" -Y "tcp.analysis.lost_segment || tcp.analysis.ack_lost_segment" 2>/dev/null)
    [ -z "$lost" ] && break
    [ "$attempt" = 3 ] && fail "the capture missed segments three times: $lost"
    echo "wire-check: the capture missed segments; capturing again" >&2
done

# One line per frame, the frame's PDUs joined by '|'.
"${decode[@]}" -Y lnet -T fields -E aggregator='|' -E separator=';' \
    -e lnet.ksm_type -e lnet.msg_type -e lnet.nid.type -e lnet.nid.addr \
    -e lnet.payload_length -e tcp.pdu.size -e lnet.bad_buflen -e lnet.bad_type \
    >"$work/pdus" 2>"$work/tshark.err" || fail "tshark failed: $(cat "$work/tshark.err")"
# Every byte of every stream: the handshake, then whole LNet PDUs.
"${decode[@]}" -Y "tcp.len > 0" -T fields -E aggregator='|' -E separator=';' \
    -e tcp.stream -e tcp.srcport -e tcp.len -e tcp.pdu.size -e lnet.ksm_type \
    >"$work/segments" 2>>"$work/tshark.err" || fail "tshark failed: $(cat "$work/tshark.err")"
# Frames the dissector failed on (an exception), beyond the length remark
# it makes on PUT payloads (checked below).
malformed=$("${decode[@]}" -Y "_ws.malformed && !lnet.bad_buflen" 2>/dev/null)
[ -z "$malformed" ] || fail "frames the dissector could not parse: $malformed"

python3 - "$work/pdus" "$work/segments" <<'PY'
import sys
from collections import defaultdict
types = {0: "ACK", 1: "PUT", 2: "GET", 3: "REPLY"}
seen = {}
big = noops = n = 0
def ints(f):
    return [int(x, 0) for x in f.split("|") if x]
for line in open(sys.argv[1]):
    f = (line.rstrip("\n").split(";") + [""] * 8)[:8]
    ksm, mtype, nidtype, plen, pdu, buflen = (ints(f[i]) for i in (0, 1, 2, 4, 5, 6))
    addrs, badtype = f[3], f[7]
    if any(k not in (0xC0, 0xC1) for k in ksm):
        sys.exit(f"ksock_msg type not NOOP or LNET: {line}")
    if any(t not in types for t in mtype):
        sys.exit(f"unknown LNet message type: {line}")
    if any(t != 2 for t in nidtype) or len(nidtype) != 2 * len(mtype):
        sys.exit(f"NIDs not two socket LND (type 2) NIDs per message: {line}")
    if any(not a.startswith("127.") for a in addrs.split("|")):
        sys.exit(f"NID address off loopback: {line}")
    if badtype:
        sys.exit(f"the dissector found a type mismatch: {line}")
    lnet = [k for k in ksm if k == 0xC1]
    if not (len(lnet) == len(mtype) == len(plen)):
        sys.exit(f"headers and messages do not pair up: {line}")
    # Each PDU is as long as its header says: 24 (NOOP), or 24 + 72 +
    # the payload length (LNET).
    want = sorted([24] * (len(ksm) - len(lnet)) + [96 + p for p in plen])
    if sorted(pdu) != want:
        sys.exit(f"PDU sizes {pdu}, headers say {want}: {line}")
    # The dissector flags a PUT whose payload no sub-dissector takes
    # ("Capture:N offset:96"): there are no others.
    if len(buflen) > sum(1 for t, p in zip(mtype, plen) if t == 1 and p > 0):
        sys.exit(f"length errors beyond PUT payloads: {line}")
    for t in mtype:
        seen[types[t]] = seen.get(types[t], 0) + 1
    big += sum(1 for p in plen if p == 1 << 20)
    noops += len(ksm) - len(lnet)
    n += len(mtype)
# Each direction of each connection carries its handshake (the 16-byte
# acceptor request and a 56-byte HELLO one way, a 56-byte HELLO back)
# and then only PDUs the dissector decoded: nothing between or after.
sent = defaultdict(int)
decoded = defaultdict(int)
for line in open(sys.argv[2]):
    stream, port, length, pdus, ksm = (line.rstrip("\n").split(";") + [""] * 5)[:5]
    key = (stream, port)
    sent[key] += int(length)
    if ksm:
        decoded[key] += sum(int(x) for x in pdus.split("|") if x)
for key, total in sorted(sent.items()):
    if total - decoded[key] not in (56, 72):
        sys.exit(f"stream {key[0]} from port {key[1]}: {total} bytes, {decoded[key]} in "
                 f"decoded PDUs: more than a handshake left over")
missing = [t for t in types.values() if t not in seen]
if missing:
    sys.exit(f"no {missing} among {n} LNet messages: {seen}")
if big < 4:
    sys.exit(f"{big} messages of 1 MiB decoded (two bulk pings move 4)")
print(f"wire-check: tshark decoded {n} LNet messages ({seen}, {big} of 1 MiB) and {noops} NOOPs, "
      f"every byte of {len(sent)} stream directions")
PY
