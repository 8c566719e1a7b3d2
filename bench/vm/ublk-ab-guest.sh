#!/bin/bash
# Hand-run comparisons of ublk settings in one vmlab guest (docs/benchmarks.md, "Hand-run comparisons"): for
# each variant in turn, RAID6 over the guest's first six disks is created anew, served with `paraid serve
# --ublk` plus the variant's words (environment settings first, then flags), prefilled, and measured with fio
# (QD as given, O_DIRECT, io_uring, 5 s per job). One result line per variant and job on stdout.
#
#   cp target-bench/release/paraid /tmp/ab/ && cp bench/vm/ublk-ab-guest.sh /tmp/ab/ && cd /tmp/ab &&
#   /work/shared/vmlab/run.sh --disks 6 --cpus 2 --mem 3072 --share /tmp/ab -- \
#     'VARIANTS="PARAID_UBLK_INLINE=on;PARAID_UBLK_INLINE=off" JOBS="randread 4k 1;randwrite 4k 32" \
#      bash /host/ublk-ab-guest.sh'
#
# VARIANTS: ';'-separated, e.g. "--merge-write-kib 1024;--merge-write-kib 0" or "--workers 16 --ublk-queues 2".
# JOBS: ';'-separated "RW BLOCK QD [fio args]", e.g. "write 128k 32" or "write 4k 1 --fsync=1".
set -u
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
modprobe ublk_drv
# shellcheck disable=SC2086
set -- $DISKS
disks=("$1" "$2" "$3" "$4" "$5" "$6")
IFS=';' read -ra variants <<< "$VARIANTS"
IFS=';' read -ra jobs <<< "$JOBS"
for variant in "${variants[@]}"; do
    env_words=()
    flags=()
    for word in $variant; do
        case $word in *=*) env_words+=("$word");; *) flags+=("$word");; esac
    done
    /host/paraid create --force --level 6 --chunk 64K "${disks[@]}" > /dev/null 2>&1
    env "${env_words[@]}" /host/paraid serve --ublk --control /run/ab.ctl "${flags[@]}" "${disks[@]}" 2> /tmp/ab.log &
    pid=$!
    device=""
    for _ in $(seq 100); do
        device=$(grep -o '/dev/ublkb[0-9]*' /tmp/ab.log | head -1)
        [ -n "$device" ] && [ -b "$device" ] && break
        sleep 0.2
    done
    [ -n "$device" ] || { echo "variant '$variant': paraid serve --ublk did not come up"; cat /tmp/ab.log; exit 1; }
    fio --name=prefill --filename="$device" --rw=write --bs=1M --iodepth=32 --direct=1 --ioengine=io_uring \
        --size=256M > /dev/null
    for job in "${jobs[@]}"; do
        # shellcheck disable=SC2086
        set -- $job
        rw=$1 block=$2 depth=$3
        shift 3
        fio --name=ab --filename="$device" --rw="$rw" --bs="$block" --iodepth="$depth" "$@" --direct=1 \
            --ioengine=io_uring --size=256M --time_based --runtime=5 --norandommap --randrepeat=0 \
            --output-format=terse \
            | awk -F';' -v v="$variant" -v j="$job" \
                '{printf "variant=%s job=%s read_MiBs=%d read_iops=%s read_lat_us=%s write_MiBs=%d write_iops=%s write_lat_us=%s\n", v, j, $7/1024, $8, $40, $48/1024, $49, $81}'
    done
    kill "$pid"
    wait "$pid"
done
