#!/bin/bash
# Runs inside the shared/vmlab guest, started by bench/vm/rebuild (not by hand): how fast md raid6 and paraid
# RAID6 rebuild a member onto a blank disk, on disks that QEMU throttles to one bandwidth each (the host script
# sets it), against that bandwidth as one disk alone reaches it.
# Disks: six members, one spare, one reference (the bar is measured on the reference, never on a member).
# Everything goes to /host/$VM_OUT/: bar-*/ and parallel/ (fio JSON), md/ and paraid/ (one rebuild-<N>.txt per
# repeat: key=value lines with the times and the guest's CPU; paraid's status JSON at the end of each).
# Settings come from the environment (VM_OUT, PARAID, REPEATS, BAR_SECS, PARAID_WORKERS); the host sets them all.
set -u
# shellcheck source=bench/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

# shellcheck disable=SC2086
set -- $DISKS
if [ $# -lt 8 ]; then log "need 8 data disks, have $#"; exit 2; fi
members=("$1" "$2" "$3" "$4" "$5" "$6")
spare=$7
reference=$8

{
    guest_facts
    echo "disk_bytes=$(blockdev --getsize64 "$1")"
    echo "ticks_per_s=$(getconf CLK_TCK)"
} > "$out/guest-facts.txt"

now() { date +%s.%N; }

# bar DIR DEVICES...: each device written sequentially for $BAR_SECS s, all at once (one fio job each, summed),
# with 1 MiB requests at QD32 and with 4 MiB at QD8 (the host takes the better: the disks' best sequential write).
bar() {
    local dir=$1
    shift
    mkdir -p "$dir"
    local block depth jobs=()
    for device in "$@"; do jobs+=("--name=${device#/dev/}" "--filename=$device"); done
    for spec in 1M:32 4M:8; do
        block=${spec%:*} depth=${spec#*:}
        fio --rw=write --bs="$block" --iodepth="$depth" --direct=1 --ioengine=io_uring --time_based \
            --runtime="$BAR_SECS" --group_reporting "${jobs[@]}" \
            --output-format=json --output="$dir/write-$block.json" > "$dir/write-$block.stdout" 2>&1 \
            || log "${dir#"$out"/}: fio $block failed"
    done
}

# The wall time and the guest's busy CPU ticks at the start and end of one rebuild, for the host to divide.
mark() { echo "$1_s=$(now) $1_busy_ticks=$(busy_ticks)"; }

run_md() {
    local dir=$out/md
    mkdir -p "$dir"
    mdadm --zero-superblock "${members[@]}" "$spare" > /dev/null 2>&1
    # --assume-clean: no initial resync; no bitmap, so that a re-added disk is recovered in full. md's
    # recovery is not throttled here: speed_limit_max above any disk's rate, no other I/O to yield to.
    if ! mdadm --create /dev/md0 --run --force --level=6 --raid-devices=6 --chunk=64 --assume-clean \
            --bitmap=none --metadata=1.2 "${members[@]}" > "$dir/mdadm.log" 2>&1; then
        log "md: mdadm --create failed (see md/mdadm.log)"
        return 1
    fi
    echo 2000000 > /proc/sys/dev/raid/speed_limit_max
    # md at its best here (vmlab's README: a larger stripe cache and two worker threads beat md's defaults).
    echo 4096 > /sys/block/md0/md/stripe_cache_size
    echo 2 > /sys/block/md0/md/group_thread_cnt
    {
        echo "component_kib=$(cat /sys/block/md0/md/component_size)"
        echo "stripe_cache_size=$(cat /sys/block/md0/md/stripe_cache_size)"
        echo "group_thread_cnt=$(cat /sys/block/md0/md/group_thread_cnt)"
        echo "speed_limit_min_kib_s=$(cat /proc/sys/dev/raid/speed_limit_min)"
        echo "speed_limit_max_kib_s=$(cat /proc/sys/dev/raid/speed_limit_max)"
    } > "$dir/facts.txt"
    # Each repeat fails the first member and adds a blank disk (superblock zeroed, contents discarded), the
    # spare and the member failed the time before in turn.
    local blank=$spare failed=${members[0]}
    for repeat in $(seq 1 "$REPEATS"); do
        mdadm /dev/md0 --fail "$failed" --remove "$failed" >> "$dir/mdadm.log" 2>&1
        mdadm --zero-superblock "$blank" >> "$dir/mdadm.log" 2>&1
        blkdiscard -f "$blank" >> "$dir/mdadm.log" 2>&1
        local file=$dir/rebuild-$repeat.txt
        mark start > "$file"
        mdadm /dev/md0 --add "$blank" >> "$dir/mdadm.log" 2>&1
        # Recovery starts a moment after --add: wait for it to begin, then to end.
        for _ in $(seq 100); do
            [ "$(cat /sys/block/md0/md/sync_action)" = recover ] && break
            sleep 0.05
        done
        while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.1; done
        mark end >> "$file"
        echo "degraded_after=$(cat /sys/block/md0/md/degraded) disk=$blank" >> "$file"
        cat /proc/mdstat >> "$dir/mdadm.log"
        log "md: rebuild $repeat onto $blank done"
        local next=$failed
        failed=$blank blank=$next
    done
    mdadm --stop /dev/md0 >> "$dir/mdadm.log" 2>&1
    mdadm --zero-superblock "${members[@]}" "$spare" > /dev/null 2>&1
}

# paraid status --json, one line.
paraid_status() { "$PARAID" status --control /run/p.sock.ctl --json 2> /dev/null; }
# The "last_result" object of a status line (flat: no nested objects), empty if there is none yet.
last_result() { grep -o '"last_result":{[^}]*}' <<< "$1"; }

run_paraid() {
    local dir=$out/paraid
    mkdir -p "$dir"
    local disks=("${members[@]}")
    for disk in "${disks[@]}" "$spare"; do blkdiscard -f "$disk" > /dev/null 2>&1; done
    if ! "$PARAID" create --level 6 --chunk 64K "${disks[@]}" > "$dir/create.log" 2>&1; then
        log "paraid: create failed (see paraid/create.log)"
        return 1
    fi
    modprobe nbd nbds_max=2
    rm -f /run/p.sock /run/p.sock.ctl
    "$PARAID" serve --socket /run/p.sock --control /run/p.sock.ctl --workers "$PARAID_WORKERS" "${disks[@]}" \
        > "$dir/serve.log" 2>&1 &
    local pid=$!
    wait_for_socket /run/p.sock.ctl
    # Fill the whole array, so that the rebuild reads and writes data everywhere, not never-written space.
    if attach_paraid "$dir/nbd-client.log"; then
        fio --name=fill --filename=/dev/nbd0 --rw=write --bs=1M --iodepth=32 --direct=1 --ioengine=io_uring \
            --output-format=json --output="$dir/fill.json" > "$dir/fill.stdout" 2>&1 || log "paraid: fill failed"
        nbd-client -d /dev/nbd0 >> "$dir/nbd-client.log" 2>&1
    else
        log "paraid: nbd-client could not attach (see paraid/nbd-client.log)"
    fi
    paraid_status > "$dir/status-before.json"
    local blank=$spare failed=${members[0]}
    for repeat in $(seq 1 "$REPEATS"); do
        "$PARAID" fail --control /run/p.sock.ctl --json 0 >> "$dir/control.log" 2>&1
        [ "$repeat" = 1 ] || blkdiscard -f "$blank" >> "$dir/control.log" 2>&1
        local file=$dir/rebuild-$repeat.txt
        # Done when no progress is shown and the last result is a new one (the one before names the previous
        # rebuild, which also shows no progress).
        local previous status="" latest
        previous=$(last_result "$(paraid_status)")
        mark start > "$file"
        "$PARAID" add --control /run/p.sock.ctl --json "$blank" >> "$dir/control.log" 2>&1
        local deadline=$(($(date +%s) + 3600))
        while [ "$(date +%s)" -lt "$deadline" ]; do
            status=$(paraid_status)
            latest=$(last_result "$status")
            case $status in
                *'"progress":null'*) [ -n "$latest" ] && [ "$latest" != "$previous" ] && break ;;
            esac
            kill -0 "$pid" 2> /dev/null || { log "paraid: serve exited during the rebuild"; break; }
            sleep 0.1
        done
        mark end >> "$file"
        echo "disk=$blank" >> "$file"
        echo "$status" > "$dir/status-$repeat.json"
        log "paraid: rebuild $repeat onto $blank done"
        local next=$failed
        failed=$blank blank=$next
    done
    echo "paraid_serve_cpu_ticks=$(awk '{print $14+$15}' "/proc/$pid/stat")" > "$dir/facts.txt"
    kill "$pid"
    wait "$pid"
}

log "bar: the reference disk alone, then the six members at once"
bar "$out/bar-before" "$reference"
bar "$out/parallel" "${members[@]}"
log "md raid6"
run_md
log "paraid RAID6"
run_paraid
bar "$out/bar-after" "$reference"
log "done"
