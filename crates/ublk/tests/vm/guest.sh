#!/bin/bash
# Runs inside the shared/vmlab guest (6.12 kernel, ublk_drv), started by crates/ublk/tests/vm/run: the crate's
# kernel tests, then paraid RAID6 served as /dev/ublkbN and used the way a user would:
#   1. fio writes with crc32c verification while a member is failed and a hot spare is rebuilt;
#   2. XFS made on the device, files written, the array stopped and served again, the files checked (and
#      stopped with `paraid stop`, which must say it is clean);
#   3. the device's bytes hashed before and after the restart;
#   4. paraid killed (-9) under a mounted XFS being written, with --ublk-id: the writer waits, a new paraid takes
#      the device over, the writer goes on without an error, and every file checks after another restart;
#   5. a crashed --ublk-id device given up with `paraid ublk-delete`: its waiting read fails, the id is free.
# Every step must pass; the script exits non-zero at the first failure. Settings: KERNEL_TEST, PARAID, OUT.
set -euo pipefail
log() { echo "[guest $(date +%H:%M:%S)] $*"; }
fail() { log "FAIL: $*"; exit 1; }
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
mkdir -p "$OUT"

# shellcheck disable=SC2086
set -- $DISKS
[ $# -ge 7 ] || fail "need 7 data disks, have $#"
members=("$1" "$2" "$3" "$4" "$5" "$6")
spare=$7

modprobe ublk_drv || fail "modprobe ublk_drv"
log "kernel $(uname -r); ublk control: $(ls -l /dev/ublk-control)"

log "1/6 the crate's kernel tests"
"$KERNEL_TEST" --test-threads=1 2>&1 | tee "$OUT/kernel-tests.log"
grep -q "skipped" "$OUT/kernel-tests.log" && fail "the kernel tests skipped in a guest with ublk_drv"

# serve NAME MEMBER...: paraid serve --ublk in the background; sets paraid_pid and device (/dev/ublkbN).
serve() {
    local name=$1
    shift
    "$PARAID" serve --ublk --control /run/p.ctl "$@" 2> "$OUT/serve-$name.log" &
    paraid_pid=$!
    device=""
    for _ in $(seq 150); do
        device=$(grep -o '/dev/ublkb[0-9]*' "$OUT/serve-$name.log" | head -1 || true)
        [ -n "$device" ] && [ -b "$device" ] && return 0
        kill -0 "$paraid_pid" 2>/dev/null || break
        sleep 0.2
    done
    cat "$OUT/serve-$name.log" >&2
    fail "paraid serve --ublk did not come up"
}
stop_serving() {
    kill -TERM "$paraid_pid"
    wait "$paraid_pid" || fail "paraid serve exited with $? on SIGTERM"
    [ -e "$device" ] && fail "$device still exists after paraid stopped"
    return 0
}

log "2/6 RAID6 over ${members[*]}, hot spare $spare; fio verify while slot 2 fails and the spare is rebuilt"
"$PARAID" create --level 6 --chunk 64K "${members[@]}" > "$OUT/create.log" 2>&1 || fail "paraid create"
serve first "${members[@]}" --spare "$spare"
log "serving on $device ($(blockdev --getsize64 "$device") bytes, io_min $(blockdev --getiomin "$device"), io_opt $(blockdev --getioopt "$device"))"
(
    sleep 4
    "$PARAID" fail --control /run/p.ctl 2 > "$OUT/fail.log" 2>&1
) &
failer=$!
fio --name=verify --filename="$device" --rw=randwrite --bsrange=4k-256k --direct=1 --ioengine=io_uring \
    --iodepth=16 --size=384M --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed=20261124 \
    --output="$OUT/fio-verify.txt" || fail "fio verify (see fio-verify.txt)"
wait "$failer" || fail "paraid fail (see fail.log)"
for _ in $(seq 300); do
    state=$("$PARAID" status --control /run/p.ctl --json)
    echo "$state" > "$OUT/status-after-fail.json"
    echo "$state" | grep -q '"progress":null' && break
    sleep 1
done
echo "$state" | grep -q '"progress":null' || fail "the rebuild did not finish in 300 s"
log "rebuild done; verifying every block again after the rebuild"
fio --name=verify --filename="$device" --rw=randwrite --bsrange=4k-256k --direct=1 --ioengine=io_uring \
    --iodepth=16 --size=384M --verify=crc32c --verify_only=1 --verify_fatal=1 --randseed=20261124 \
    --output="$OUT/fio-verify-after-rebuild.txt" || fail "fio verify after the rebuild"

log "3/6 XFS on $device, files, a restart"
mkfs.xfs -f -q "$device" || fail "mkfs.xfs"
mkdir -p /mnt/u
mount "$device" /mnt/u || fail "mount"
for i in $(seq 8); do
    head -c $((i * 3))M /dev/urandom > "/mnt/u/file$i"
done
(cd /mnt/u && sha256sum file*) > "$OUT/files.sha256"
umount /mnt/u
# Hashed between the unmount and the next mount (which writes XFS's log), so nothing else changes them.
head -c 512M "$device" | sha256sum > "$OUT/device-before.sha256"
stop_serving
# Slot 2's first member was failed and replaced by the spare: the array is the other five and the spare.
serve restart "${members[0]}" "${members[1]}" "${members[3]}" "${members[4]}" "${members[5]}" "$spare"
head -c 512M "$device" | sha256sum > "$OUT/device-after.sha256"
log "4/6 the device's first 512 MiB hash the same before and after the restart; the files check"
cmp "$OUT/device-before.sha256" "$OUT/device-after.sha256" || fail "device bytes differ after the restart"
mount "$device" /mnt/u || fail "mount after the restart"
(cd /mnt/u && sha256sum -c --quiet "$OUT/files.sha256") || fail "files differ after the restart"
umount /mnt/u
# `paraid stop` instead of SIGTERM: it returns once the server has exited, and says the array is clean.
"$PARAID" stop --control /run/p.ctl --json > "$OUT/stop.json" 2>&1 || fail "paraid stop: $(cat "$OUT/stop.json")"
grep -q '"state":"clean"' "$OUT/stop.json" || fail "paraid stop: $(cat "$OUT/stop.json")"
wait "$paraid_pid" || fail "paraid serve exited with $? after paraid stop"
[ -e "$device" ] && fail "$device still exists after paraid stop"

log "5/6 kill -9 of paraid under a mounted XFS (--ublk-id 7): the writer waits, a new paraid takes over, nothing lost"
array=("${members[0]}" "${members[1]}" "${members[3]}" "${members[4]}" "${members[5]}" "$spare")
serve crash "${array[@]}" --ublk-id 7
[ "$device" = /dev/ublkb7 ] || fail "--ublk-id 7 served $device"
# Into a file first: grep -q stops reading at the match, and under pipefail paraid's SIGPIPE would fail the pipe.
"$PARAID" status --control /run/p.ctl > "$OUT/status-ublk.txt"
grep -q "served: ublk /dev/ublkb7 (id 7, taken over after a crash of paraid)" "$OUT/status-ublk.txt" \
    || fail "status does not say how the array is served (see status-ublk.txt)"
mount "$device" /mnt/u || fail "mount on $device"
rm -f "$OUT/crash.sha256"
(
    for i in $(seq 60); do
        dd if=/dev/urandom of="/mnt/u/crash$i" bs=256k count=8 conv=fsync status=none || exit 1
        (cd /mnt/u && sha256sum "crash$i") >> "$OUT/crash.sha256"
    done
) &
writer=$!
sleep 3
kill -9 "$paraid_pid"
wait "$paraid_pid" 2>/dev/null || true
sleep 3
kill -0 "$writer" 2>/dev/null || fail "the writer ended while no server ran (it should wait)"
written_before=$(wc -l < "$OUT/crash.sha256")
serve takeover "${array[@]}" --ublk-id 7
[ "$device" = /dev/ublkb7 ] || fail "the takeover served $device"
wait "$writer" || fail "the writer saw an error across the crash"
log "the writer went on: $written_before files before the takeover, $(wc -l < "$OUT/crash.sha256") after"
umount /mnt/u
stop_serving
serve after-crash "${array[@]}"
mount "$device" /mnt/u || fail "mount after the crash and the takeover"
(cd /mnt/u && sha256sum -c --quiet "$OUT/crash.sha256") || fail "files written across the crash differ"
(cd /mnt/u && sha256sum -c --quiet "$OUT/files.sha256") || fail "the earlier files differ after the crash"
umount /mnt/u
stop_serving

log "6/6 giving up on a crashed --ublk-id device: paraid ublk-delete fails its waiting I/O and frees the id"
serve abandoned "${array[@]}" --ublk-id 9
"$PARAID" ublk-delete 9 > "$OUT/ublk-delete-live.log" 2>&1 && fail "ublk-delete removed a device whose server runs"
grep -q "stop that server" "$OUT/ublk-delete-live.log" || fail "ublk-delete of a live device: $(cat "$OUT/ublk-delete-live.log")"
kill -9 "$paraid_pid"
wait "$paraid_pid" 2>/dev/null || true
dd if=/dev/ublkb9 of=/dev/null bs=4k count=1 iflag=direct skip=12345 2> "$OUT/abandoned-read.log" &
reader=$!
sleep 2
kill -0 "$reader" 2>/dev/null || fail "a read of the device whose server died did not wait"
"$PARAID" ublk-delete 9 | tee "$OUT/ublk-delete.log" || fail "ublk-delete"
wait "$reader" && fail "the waiting read succeeded after the device was deleted"
[ -e /dev/ublkb9 ] && fail "/dev/ublkb9 still exists after ublk-delete"
"$PARAID" ublk-delete 9 > "$OUT/ublk-delete-again.log" 2>&1 && fail "ublk-delete of a deleted device succeeded"
grep -q "no such device" "$OUT/ublk-delete-again.log" || fail "ublk-delete again: $(cat "$OUT/ublk-delete-again.log")"
# The array itself is fine: served again (a new device), it assembles after the crash.
serve after-delete "${array[@]}"
mount "$device" /mnt/u || fail "mount after ublk-delete"
(cd /mnt/u && sha256sum -c --quiet "$OUT/crash.sha256") || fail "files differ after ublk-delete"
umount /mnt/u
stop_serving
log "PASS"
