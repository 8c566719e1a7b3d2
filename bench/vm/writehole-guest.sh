#!/bin/bash
# Runs inside the shared/vmlab guest, started by bench/vm/writehole (not by hand): what closing the write hole
# costs md raid5 (no bitmap, internal bitmap, partial parity log) and paraid RAID5 (bitmap, partial parity log),
# and RAID6 (md: no bitmap or internal bitmap, md has no PPL for RAID6; paraid: bitmap or partial parity log),
# with the same fio write jobs on each, in rounds whose order alternates. md over five disks, paraid over five
# others, served in this guest and attached with the kernel's NBD client.
# Everything goes to /host/$VM_OUT/round<R>/<target>/: fio JSON, the guest's CPU time per job, each target's
# facts (md's consistency policy in force, paraid's log counters). Settings come from the environment (VM_OUT,
# PARAID, SECS, REGION, ROUNDS, PARAID_WORKERS, TARGETS); the host script sets them all.
set -u
# shellcheck source=bench/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

# shellcheck disable=SC2086
set -- $DISKS
if [ $# -lt 10 ]; then log "need 10 data disks, have $#"; exit 2; fi
md_disks=("$1" "$2" "$3" "$4" "$5")
paraid_disks=("$6" "$7" "$8" "$9" "${10}")

# Drives with power-loss protection keep no volatile cache: the kernel then sends FUA writes as plain writes and
# no flushes (bench/vm/writehole --write-through).
if [ "${DISKS_WRITE_THROUGH:-0}" = 1 ]; then
    for disk in "${md_disks[@]}" "${paraid_disks[@]}"; do
        echo "write through" > "/sys/block/${disk#/dev/}/queue/write_cache"
    done
fi

{
    guest_facts
    echo "write_cache=$(cat "/sys/block/${md_disks[0]#/dev/}/queue/write_cache" 2>/dev/null)"
    echo "write_cache_paraid=$(cat "/sys/block/${paraid_disks[0]#/dev/}/queue/write_cache" 2>/dev/null)"
} > "$out/guest-facts.txt"

# The same writes on every target: the region written once (so read-modify-writes meet data everywhere), then
# small random writes at QD32 and QD1 (partial-stripe writes: each is logged), then sequential 1 MiB writes
# (whole stripes after gathering: nothing to log, a control).
run_jobs() {
    local dir=$1 device=$2
    fio_job "$dir" "$device" prefill write 1M 32
    job_status "$dir" prefill
    fio_job "$dir" "$device" rand-write-4K-QD32 randwrite 4k 32 --time_based --runtime="$SECS" --norandommap --randrepeat=0
    job_status "$dir" rand-write-4K-QD32
    fio_job "$dir" "$device" rand-write-4K-QD1 randwrite 4k 1 --time_based --runtime="$SECS" --norandommap --randrepeat=0
    job_status "$dir" rand-write-4K-QD1
    fio_job "$dir" "$device" seq-write-1M-QD32 write 1M 32 --time_based --runtime="$SECS"
}

# paraid's status after a job (its counters so far, and what the members' queues said last), where a paraid
# target is served; nothing for md.
job_status() {
    local dir=$1 stem=$2
    if [ -n "${paraid_serving:-}" ]; then
        "$PARAID" status --control /run/p.sock.ctl --json > "$dir/status-$stem.json" 2>> "$dir/paraid-serve.log" || true
    fi
}

md_policy_args() {
    case $1 in
        md-raid[56]) echo "--bitmap=none" ;;
        md-raid[56]-bitmap) echo "--bitmap=internal" ;;
        md-raid5-ppl) echo "--consistency-policy=ppl" ;;
    esac
}

# The level a target's name gives (md-raid6*, paraid-raid6*: RAID6 of the same five disks, three data and two
# parity chunks per stripe; everything else RAID5).
level_of() {
    case $1 in *-raid6*) echo 6 ;; *) echo 5 ;; esac
}

run_md() {
    local target=$1 dir=$2
    mkdir -p "$dir"
    mdadm --stop /dev/md0 > /dev/null 2>&1
    mdadm --zero-superblock "${md_disks[@]}" > /dev/null 2>&1
    # shellcheck disable=SC2046
    if ! mdadm --create /dev/md0 --run --force --level="$(level_of "$target")" --raid-devices=5 --chunk=64 --assume-clean \
            --metadata=1.2 $(md_policy_args "$target") "${md_disks[@]}" > "$dir/mdadm.log" 2>&1; then
        log "$target: mdadm --create failed (see $dir/mdadm.log)"
        return 1
    fi
    {
        echo "consistency_policy=$(cat /sys/block/md0/md/consistency_policy)"
        echo "bitmap=$(mdadm --detail /dev/md0 | sed -n 's/^ *Intent Bitmap : //p')"
        echo "stripe_cache_size=$(cat /sys/block/md0/md/stripe_cache_size)"
    } > "$dir/facts.txt"
    cat /proc/mdstat >> "$dir/facts.txt"
    run_jobs "$dir" /dev/md0
    mdadm --stop /dev/md0 >> "$dir/mdadm.log" 2>&1
}

# The level paraid's array was last created with (0: none yet): a target of another level creates it anew.
paraid_level=0
run_paraid() {
    local target=$1 dir=$2 policy write_back=() parity_alone=off spread=on lone=off level
    level=$(level_of "$target")
    case $target in paraid-raid[56]-ppl*) policy=ppl ;; paraid-raid[56]-journal*) policy=journal ;; *) policy=bitmap ;; esac
    case $target in *-wb) write_back=(--write-back) ;; esac
    # The journal that logs partial parity alone where its log is deep (PARAID_JOURNAL_PARITY_ALONE, on by default
    # since stop 39; the plain journal targets turn it off to compare).
    case $target in *-parity-alone) parity_alone=on ;; esac
    # Lone answers (PARAID_JOURNAL_LONE): only a write the client waits for is answered from the log; the others
    # log their partial parity alone, which needs that path on.
    case $target in *-lone) lone=on parity_alone=on ;; esac
    # Early answers gated on spare CPU (PARAID_JOURNAL_LONE=auto, stop 51).
    case $target in *-auto|*-auto-parity-ring) lone=auto parity_alone=on ;; esac
    # The log with every entry on its stripe's P member's ring, as before stop 44 (PARAID_PPL_SPREAD=off).
    case $target in *-parity-ring) spread=off ;; esac
    if [ "$paraid_level" != "$level" ]; then
        if ! "$PARAID" create --force --level "$level" --chunk 64K "${paraid_disks[@]}" >> "$out/paraid-create.log" 2>&1; then
            log "paraid: create of RAID$level failed (see paraid-create.log)"
            return 1
        fi
        paraid_level=$level
        modprobe nbd nbds_max=4
    fi
    mkdir -p "$dir"
    rm -f /run/p.sock /run/p.sock.ctl
    # SERVE_RUST_LOG (bench/vm/writehole --serve-log): the serve's log filter, for its lines in paraid-serve.log.
    env ${SERVE_RUST_LOG:+RUST_LOG="$SERVE_RUST_LOG"} PARAID_JOURNAL_LONE=$lone PARAID_JOURNAL_PARITY_ALONE=$parity_alone PARAID_PPL_SPREAD=$spread "$PARAID" serve --socket /run/p.sock --workers "$PARAID_WORKERS" --consistency-policy "$policy" \
        "${write_back[@]}" "${paraid_disks[@]}" > "$dir/paraid-serve.log" 2>&1 &
    local pid=$!
    wait_for_socket /run/p.sock
    if attach_paraid "$dir/nbd-client.log"; then
        paraid_serving=1
        run_jobs "$dir" /dev/nbd0
        paraid_serving=
        "$PARAID" status --control /run/p.sock.ctl --json > "$dir/status.json" 2>> "$dir/paraid-serve.log"
        echo "paraid_serve_cpu_ticks=$(awk '{print $14+$15}' "/proc/$pid/stat")" > "$dir/facts.txt"
        nbd-client -d /dev/nbd0 >> "$dir/nbd-client.log" 2>&1
    else
        log "$target: nbd-client could not attach (see $dir/nbd-client.log)"
    fi
    kill "$pid"
    wait "$pid"
}

IFS=, read -r -a targets <<< "$TARGETS"
for round in $(seq 1 "$ROUNDS"); do
    order=("${targets[@]}")
    if [ $((round % 2)) = 0 ]; then
        # Every other round runs the targets in reverse, so that no target is always first (or last).
        order=()
        for ((i = ${#targets[@]} - 1; i >= 0; i--)); do order+=("${targets[i]}"); done
    fi
    for target in "${order[@]}"; do
        dir=$out/round$round/$target
        log "round $round: $target"
        case $target in
            md-*) run_md "$target" "$dir" ;;
            paraid-*) run_paraid "$target" "$dir" ;;
        esac
    done
done
log "done"
