# Sourced by the guest scripts of the VM suites (bench/vm/guest.sh, writehole-guest.sh, rebuild-guest.sh,
# slowmember-guest.sh), inside the shared/vmlab guest: where results go, logging, the guest's facts, one fio job with
# the guest's CPU time, paraid served and attached over NBD, and the device paraid serves over ublk.
# Needs VM_OUT (the results directory below the repository, which the guest sees at /host).
out=/host/$VM_OUT
mkdir -p "$out"
# The guest's minimal /dev has no /dev/fd, which process substitution needs.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
exec 2> >(tee -a "$out/guest-stderr.log" >&2)

log() { echo "[guest $(date +%H:%M:%S)] $*"; }

# The guest and its tools, as key=value lines on stdout.
guest_facts() {
    echo "kernel=$(uname -r)"
    echo "vcpus=$(nproc)"
    echo "cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "mem_kib=$(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
    echo "fio=$(fio --version)"
    echo "mdadm=$(mdadm --version 2>&1 | head -1)"
    echo "nbd_client=$(nbd-client -V 2>&1 | head -1)"
    echo "paraid=$("$PARAID" --version 2>&1 | head -1)"
}

# ublk_device LOG: the block device `paraid serve --ublk` names in LOG, once it exists (up to 20 s); nothing if none.
ublk_device() {
    local device
    for _ in $(seq 100); do
        device=$(grep -o '/dev/ublkb[0-9]*' "$1" | head -1)
        if [ -n "$device" ] && [ -b "$device" ]; then
            echo "$device"
            return
        fi
        sleep 0.2
    done
}

# Whole-guest busy CPU ticks (every process and kernel thread: the guest runs nothing else).
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }

# fio_job DIR DEVICE NAME RW BLOCK QD [extra fio args]: one fio job (O_DIRECT, io_uring, region $REGION), its
# JSON in DIR/NAME.json and the guest's busy CPU ticks over it in DIR/NAME.cpu. A job that writes ends with a
# flush of the device (`sync DEVICE`: fsync, which the kernel sends as a FLUSH), timed into NAME.cpu as flush_s
# and inside the busy window: a target that answers writes before they are in place (paraid --write-back) pays
# for them there, not in the job after it.
fio_job() {
    local dir=$1 device=$2 name=$3 rw=$4 block=$5 depth=$6
    shift 6
    mkdir -p "$dir"
    local busy_before wall_before busy_after wall_after
    busy_before=$(busy_ticks); wall_before=$(date +%s.%N)
    fio --name="$name" --filename="$device" --rw="$rw" --bs="$block" --iodepth="$depth" --numjobs=1 \
        --direct=1 --ioengine=io_uring --size="$REGION" "$@" \
        --output-format=json --output="$dir/$name.json" > "$dir/$name.stdout" 2>&1
    local status=$?
    local flush_s=0 flush_before
    case $rw in
        *write*|rw|randrw)
            flush_before=$(date +%s.%N)
            sync "$device"
            flush_s=$(awk "BEGIN{print $(date +%s.%N) - $flush_before}")
            ;;
    esac
    busy_after=$(busy_ticks); wall_after=$(date +%s.%N)
    echo "busy_ticks=$((busy_after - busy_before)) ticks_per_s=$(getconf CLK_TCK) wall_s=$(awk "BEGIN{print $wall_after - $wall_before}") flush_s=$flush_s" \
        > "$dir/$name.cpu"
    log "${dir#"$out"/} $name: fio exit $status"
    return $status
}

# wait_for_socket PATH: until PATH is a socket (paraid serve starting up), at most about 20 s.
wait_for_socket() {
    for _ in $(seq 100); do
        [ -S "$1" ] && return 0
        sleep 0.2
    done
    return 1
}

# attach_paraid LOG: /dev/nbd0 on paraid's NBD socket /run/p.sock with one connection (-C 1; a client without -C
# names the export instead); nbd-client's output is appended to LOG.
attach_paraid() {
    nbd-client -u /run/p.sock /dev/nbd0 -b 4096 -C 1 >> "$1" 2>&1 \
        || nbd-client -u /run/p.sock /dev/nbd0 -b 4096 -N paraid >> "$1" 2>&1
}
