#!/bin/bash
# Runs inside the shared/vmlab guest, started by bench/vm/run (not by hand): the same fio jobs on
# one raw virtio disk, on md raid6 over six disks (defaults, then md's tuned settings) and on
# paraid RAID6 over six other disks, served in this guest and attached with the kernel's NBD client, then
# created again on those disks and served as a ublk block device (paraid-raid6-ublk).
# Everything goes to /host/$VM_OUT (the host's results directory): fio JSON, the guest's CPU time
# per job, logs and facts. Settings come from the environment (VM_OUT, PARAID, SECS, REGION,
# NBD_CONNECTIONS, PARAID_WORKERS, TARGETS); the host script sets them all.
set -u
# shellcheck source=bench/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

# shellcheck disable=SC2086
set -- $DISKS
if [ $# -lt 13 ]; then log "need 13 data disks, have $#"; exit 2; fi
raw_disk=$1
md_disks=("$2" "$3" "$4" "$5" "$6" "$7")
paraid_disks=("$8" "$9" "${10}" "${11}" "${12}" "${13}")

guest_facts > "$out/guest-facts.txt"

# Prefill writes the region once so reads meet written data on every target (paraid reads of
# never-written stripes might otherwise cost less than md's); reads run before the writes.
run_jobs() {
    local target=$1 device=$2 dir=$out/$1
    log "$target: prefill $REGION of $device"
    fio_job "$dir" "$device" prefill write 1M 32
    fio_job "$dir" "$device" seq-read-1M read 1M 32 --time_based --runtime="$SECS"
    fio_job "$dir" "$device" rand-read-4K randread 4k 32 --time_based --runtime="$SECS" --norandommap --randrepeat=0
    fio_job "$dir" "$device" seq-write-1M write 1M 32 --time_based --runtime="$SECS"
    fio_job "$dir" "$device" rand-write-4K randwrite 4k 32 --time_based --runtime="$SECS" --norandommap --randrepeat=0
}

wants() { case ",$TARGETS," in *",$1,"*) return 0;; *) return 1;; esac; }

if wants raw-disk; then
    run_jobs raw-disk "$raw_disk"
fi

if wants md-raid6 || wants md-raid6-tuned; then
    log "md: mdadm --create raid6 over ${md_disks[*]}"
    if mdadm --create /dev/md0 --run --force --level=6 --raid-devices=6 --chunk=64 --assume-clean \
            --metadata=1.2 "${md_disks[@]}" > "$out/mdadm-create.log" 2>&1; then
        cat /proc/mdstat > "$out/mdstat.txt"
        for knob in stripe_cache_size group_thread_cnt; do
            echo "$knob=$(cat /sys/block/md0/md/$knob)" >> "$out/md-defaults.txt"
        done
        dmesg | grep -iE 'raid6|xor' > "$out/dmesg-raid6.txt"
        if wants md-raid6; then run_jobs md-raid6 /dev/md0; fi
        if wants md-raid6-tuned; then
            # The settings vmlab's README found best for md here (chunk stays 64K, like paraid's).
            echo 4096 > /sys/block/md0/md/stripe_cache_size
            echo 2 > /sys/block/md0/md/group_thread_cnt
            run_jobs md-raid6-tuned /dev/md0
        fi
        mdadm --stop /dev/md0 >> "$out/mdadm-create.log" 2>&1
    else
        log "md: mdadm --create failed (see mdadm-create.log)"
    fi
fi

if wants paraid-raid6; then
    log "paraid: create RAID6 over ${paraid_disks[*]}"
    nbd-client -h > "$out/nbd-client-help.txt" 2>&1
    if "$PARAID" create --level 6 --chunk 64K "${paraid_disks[@]}" > "$out/paraid-create.log" 2>&1; then
        "$PARAID" serve --socket /run/p.sock --workers "$PARAID_WORKERS" "${paraid_disks[@]}" \
            > "$out/paraid-serve.log" 2>&1 &
        paraid_pid=$!
        wait_for_socket /run/p.sock
        modprobe nbd nbds_max=4
        # -u: the host argument is a Unix socket path; -C: connections (paraid advertises multi-conn).
        # Without -C (a client that lacks it) the run says it used one connection.
        connections=$NBD_CONNECTIONS
        attached=0
        for attempt in "-C $NBD_CONNECTIONS" "-C $NBD_CONNECTIONS -N paraid" "-N paraid"; do
            # shellcheck disable=SC2086
            if nbd-client -u /run/p.sock /dev/nbd0 -b 4096 $attempt >> "$out/nbd-client.log" 2>&1; then
                attached=1
                case $attempt in -C*) ;; *) connections=1;; esac
                echo "nbd_client_args=-u /run/p.sock /dev/nbd0 -b 4096 $attempt" >> "$out/guest-facts.txt"
                break
            fi
        done
        if [ $attached = 1 ]; then
            echo "nbd0_size_bytes=$(blockdev --getsize64 /dev/nbd0)" >> "$out/guest-facts.txt"
            echo "nbd_connections=$connections" >> "$out/guest-facts.txt"
            run_jobs paraid-raid6 /dev/nbd0
            paraid_cpu=$(awk '{print $14+$15}' "/proc/$paraid_pid/stat")
            echo "paraid_serve_cpu_ticks=$paraid_cpu" >> "$out/guest-facts.txt"
            echo "paraid_serve_user_sys_ticks=$(awk '{print $14 "/" $15}' "/proc/$paraid_pid/stat")" \
                >> "$out/guest-facts.txt"
            # Per thread: where paraid's time went (name, user ticks, system ticks).
            for task in /proc/"$paraid_pid"/task/*; do
                echo "$(cat "$task/comm") $(awk '{print $14, $15}' "$task/stat")"
            done > "$out/paraid-threads.txt"
            nbd-client -d /dev/nbd0 >> "$out/nbd-client.log" 2>&1
        else
            log "paraid: nbd-client could not attach (see nbd-client.log)"
        fi
        kill "$paraid_pid"
        wait "$paraid_pid"
    else
        log "paraid: create failed (see paraid-create.log)"
    fi
fi
if wants paraid-raid6-ublk; then
    # The same six disks, the array created anew, served as a kernel block device: no NBD client, no socket.
    log "paraid: create RAID6 over ${paraid_disks[*]} for ublk"
    if modprobe ublk_drv 2>> "$out/paraid-ublk.log" \
            && "$PARAID" create --force --level 6 --chunk 64K "${paraid_disks[@]}" >> "$out/paraid-ublk.log" 2>&1; then
        "$PARAID" serve --ublk --control /run/pu.ctl --workers "$PARAID_WORKERS" "${paraid_disks[@]}" \
            2> "$out/paraid-ublk-serve.log" &
        ublk_pid=$!
        ublk_device=$(ublk_device "$out/paraid-ublk-serve.log")
        if [ -n "$ublk_device" ]; then
            echo "ublk_device=$ublk_device" >> "$out/guest-facts.txt"
            run_jobs paraid-raid6-ublk "$ublk_device"
            echo "paraid_ublk_serve_user_sys_ticks=$(awk '{print $14 "/" $15}' "/proc/$ublk_pid/stat")" \
                >> "$out/guest-facts.txt"
        else
            log "paraid: serve --ublk did not come up (see paraid-ublk-serve.log)"
        fi
        kill "$ublk_pid"
        wait "$ublk_pid"
    else
        log "paraid: ublk_drv or create failed (see paraid-ublk.log)"
    fi
fi
log "done"
