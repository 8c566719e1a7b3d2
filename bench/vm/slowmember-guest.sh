#!/bin/bash
# Runs inside the shared/vmlab guest, started by bench/vm/slowmember (not by hand): random reads from md raid6 and
# paraid RAID6 over six disks of which QEMU holds one (the second) to a few I/Os per second: a slow member.
# First each of the first two disks alone (their own latency), then each array: created on the six disks, its
# first $REGION filled, then random 4 KiB reads at QD1 and QD16 for $SECS s each (paraid served over ublk).
# Everything goes to /host/$VM_OUT/: disk/, md/ and paraid/ (fio JSON; paraid's status JSON after the reads).
# Settings come from the environment (VM_OUT, PARAID, REGION, SECS, PARAID_WORKERS); the host sets them all.
set -u
# shellcheck source=bench/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

# shellcheck disable=SC2086
set -- $DISKS
if [ $# -lt 6 ]; then log "need 6 data disks, have $#"; exit 2; fi
members=("$1" "$2" "$3" "$4" "$5" "$6")
guest_facts > "$out/guest-facts.txt"

# reads DIR DEVICE: the fill, then random reads at QD1 and QD16 over the filled region.
reads() {
    local dir=$1 device=$2
    fio_job "$dir" "$device" fill write 1M 16
    fio_job "$dir" "$device" randread-qd1 randread 4k 1 --time_based --runtime="$SECS"
    fio_job "$dir" "$device" randread-qd16 randread 4k 16 --time_based --runtime="$SECS"
}

log "each of the first two disks alone (the second is the throttled one)"
for disk in "${members[0]}" "${members[1]}"; do
    fio_job "$out/disk" "$disk" "randread-qd1-${disk#/dev/}" randread 4k 1 --time_based --runtime=5
done

log "md raid6"
mkdir -p "$out/md"
if mdadm --create /dev/md0 --run --force --level=6 --raid-devices=6 --chunk=64 --assume-clean --bitmap=none \
        --metadata=1.2 "${members[@]}" > "$out/md/mdadm.log" 2>&1; then
    reads "$out/md" /dev/md0
    mdadm --stop /dev/md0 >> "$out/md/mdadm.log" 2>&1
else
    log "md: mdadm --create failed (see md/mdadm.log)"
fi
mdadm --zero-superblock "${members[@]}" > /dev/null 2>&1

log "paraid RAID6 over ublk"
mkdir -p "$out/paraid"
if modprobe ublk_drv 2>> "$out/paraid/create.log" \
        && "$PARAID" create --force --level 6 --chunk 64K "${members[@]}" >> "$out/paraid/create.log" 2>&1; then
    "$PARAID" serve --ublk --control /run/pu.ctl --workers "$PARAID_WORKERS" "${members[@]}" \
        2> "$out/paraid/serve.log" &
    pid=$!
    device=$(ublk_device "$out/paraid/serve.log")
    if [ -n "$device" ]; then
        reads "$out/paraid" "$device"
        "$PARAID" status --control /run/pu.ctl --json > "$out/paraid/status.json" 2>> "$out/paraid/serve.log"
    else
        log "paraid: serve --ublk did not come up (see paraid/serve.log)"
    fi
    kill "$pid"
    wait "$pid"
else
    log "paraid: ublk_drv or create failed (see paraid/create.log)"
fi
log "done"
