#!/usr/bin/env bash
# A single-node Slurm on this machine, for tests/slurm: Debian's slurm-wlm with munge,
# slurmctld and slurmd as root, no systemd, no cgroups, no accounting.
#
#   bash .ci/slurm_setup.sh up      # install if needed, write slurm.conf, start the daemons
#   bash .ci/slurm_setup.sh down    # stop the daemons that `up` started (by their pid files)
#   bash .ci/slurm_setup.sh status
#
# `up` is idempotent: daemons already running from our pid files are left alone. It prints
# the line to use the cluster (`export SLURM_CONF=...`; our slurm.conf lives under
# $ZOO_SLURM_DIR, /etc/slurm is not touched).
# Exit codes: 0 ready; 77 Slurm cannot be installed here (not root, no apt-get, or apt
# failed): callers skip; 1 installed but a daemon did not come up: callers fail.
set -euo pipefail

DIR=${ZOO_SLURM_DIR:-/tmp/zoo-slurm}
CPUS=${ZOO_SLURM_CPUS:-8}        # declared CPUs (may exceed the real cores: config_overrides)
CONF=$DIR/slurm.conf
HOSTS_MARK="# added by zoo .ci/slurm_setup.sh"
WAIT_S=20                        # how long a daemon may take to come up

say() { echo "slurm_setup: $*" >&2; }
die() { say "error: $*"; exit 1; }
cannot_install() { say "cannot install Slurm: $*"; exit 77; }

# A daemon that fails names its log; CI shows the last lines.
die_log() {  # log file, message
    say "error: $2; the end of $1:"
    tail -n 5 "$1" >&2 2>/dev/null || true
    exit 1
}

# A live process: not a zombie (a killed daemon may linger unreaped, and kill -0 finds it).
pid_alive() {
    local state
    state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ $state != Z* ]]
}
alive() { [[ -s $1 ]] && pid_alive "$(cat "$1")"; }

# Run `$@` until it succeeds, for at most $WAIT_S seconds.
poll() {
    local deadline=$((SECONDS + WAIT_S))
    while ((SECONDS < deadline)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

# Slurm clients retry for a long time while a daemon is down: each call gets 5 s.
slurm_cmd() { SLURM_CONF=$CONF timeout 5 "$@"; }
munge_answers() { munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
controller_up() { slurm_cmd scontrol ping | grep -q 'is UP'; }
no_jobs() { [[ -z $(slurm_cmd squeue -h -o %i) ]]; }
cancel_all_jobs() { slurm_cmd squeue -h -o %i | xargs -r env SLURM_CONF="$CONF" scancel || true; }
node_ready() {
    case $(slurm_cmd sinfo -h -n "$HOST" -o %T) in idle* | mixed* | allocated*) return 0 ;; esac
    return 1
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
            && command -v munged >/dev/null; then
        return
    fi
    [[ $(id -u) == 0 ]] || cannot_install "not root (uid $(id -u)); apt-get needs root"
    command -v apt-get >/dev/null || cannot_install "no apt-get on this machine"
    say "installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    local log=$DIR/apt.log
    # A fresh machine may have no package lists yet: update only when the install fails.
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >"$log" 2>&1; then
        apt-get update -q >>"$log" 2>&1 || cannot_install "apt-get update failed (see $log)"
        apt-get install -y -q --no-install-recommends slurm-wlm munge >>"$log" 2>&1 \
            || cannot_install "apt-get install slurm-wlm munge failed: $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
}

ensure_hostname() {
    HOST=$(hostname -s)
    if ! getent hosts "$HOST" >/dev/null; then
        say "hostname $HOST does not resolve; adding it to /etc/hosts"
        echo "127.0.1.1 $HOST $HOSTS_MARK" >>/etc/hosts
    fi
}

start_munge() {
    # Reuse a munged that already answers (the system's, or ours from an earlier `up`).
    munge_answers && return
    [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create >/dev/null \
        || die "no /etc/munge/munge.key and mungekey --create failed"
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid \
        || die_log /var/log/munge/munged.log "munged did not start"
    echo /run/munge/munged.pid >"$DIR/pids/munged"
    poll munge_answers || die_log /var/log/munge/munged.log "munged started but does not answer"
}

write_conf() {
    cat >"$CONF" <<EOF
# Written by .ci/slurm_setup.sh: one node, root daemons, no systemd/cgroups/accounting.
ClusterName=zoo
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again only once its step credentials expire (default 120 s).
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/pids/slurmctld.pid
SlurmdPidFile=$DIR/pids/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Nothing wakes the scheduler when a requeued job's begin time passes: look often.
SchedulerParameters=sched_interval=2,bf_interval=2
# Declaring more CPUs than the machine has needs config_overrides (else the node registers invalid).
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to 'scontrol show job' this long (there is no sacct).
MinJobAge=600
KillWait=10
InactiveLimit=0
NodeName=$HOST CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # name, command...
    local name=$1; shift
    local pidfile=$DIR/pids/$name.pid
    alive "$pidfile" && return
    "$@" || die_log "$DIR/log/$name.log" "$name did not start"
    poll alive "$pidfile" || die_log "$DIR/log/$name.log" "$name wrote no live pid file $pidfile"
}

up() {
    mkdir -p "$DIR"/{state,spool,log,pids}
    install_packages
    ensure_hostname
    start_munge
    if ! alive "$DIR/pids/slurmctld.pid"; then
        write_conf
        start_daemon slurmctld slurmctld -f "$CONF"
        poll controller_up || die_log "$DIR/log/slurmctld.log" "slurmctld does not answer"
        # Jobs saved in $DIR/state by an earlier life of this cluster (a machine stopped with
        # jobs running) would be requeued now: they are never wanted. Job ids go on counting.
        cancel_all_jobs
    fi
    start_daemon slurmd slurmd -f "$CONF"
    poll node_ready || die_log "$DIR/log/slurmd.log" "node $HOST is not idle $WAIT_S s after start"
    say "ready: $(slurm_cmd sinfo -h -o 'partition %P: %D node, %c CPUs, %T' | head -n 1)"
    echo "export SLURM_CONF=$CONF"
}

stop_pidfile() {  # name, pidfile
    local pid
    alive "$2" || return 0
    pid=$(cat "$2")
    kill "$pid"
    for _ in $(seq 100); do
        pid_alive "$pid" || { say "stopped $1 ($pid)"; return 0; }
        sleep 0.1
    done
    say "$1 ($pid) still running 10 s after SIGTERM"
    return 1
}

down() {
    [[ -d $DIR/pids ]] || return 0
    if alive "$DIR/pids/slurmctld.pid"; then
        # Jobs still running would leave slurmstepd and their tasks behind.
        cancel_all_jobs
        poll no_jobs || say "jobs still listed $WAIT_S s after scancel: $(slurm_cmd squeue -h -o '%i %T' | tr '\n' ' ')"
    fi
    local rc=0
    stop_pidfile slurmd "$DIR/pids/slurmd.pid" || rc=1
    stop_pidfile slurmctld "$DIR/pids/slurmctld.pid" || rc=1
    if [[ -s $DIR/pids/munged ]]; then
        stop_pidfile munged "$(cat "$DIR/pids/munged")" || rc=1
        rm -f "$DIR/pids/munged"
    fi
    sed -i "/$HOSTS_MARK\$/d" /etc/hosts 2>/dev/null || true
    return $rc
}

status() {
    for name in slurmctld slurmd; do
        if alive "$DIR/pids/$name.pid"; then echo "$name: running ($(cat "$DIR/pids/$name.pid"))"
        else echo "$name: stopped"; fi
    done
    if [[ -s $DIR/pids/munged ]] && alive "$(cat "$DIR/pids/munged")"; then echo "munged: running (ours)"
    elif munge_answers; then echo "munged: running (not ours)"
    else echo "munged: stopped"; fi
}

case ${1:-up} in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 [up|down|status]" >&2; exit 2 ;;
esac
