#!/usr/bin/env bash
# A Slurm on this machine, for tests/slurm: Debian's slurm-wlm with munge, slurmctld and
# slurmd as root, no systemd, no cgroups, no accounting. One node by default; with
# ZOO_SLURM_NODES=N (N > 1) a cluster of N simulated nodes, each a network namespace with
# its own address, hostname and slurmd (see "Several nodes" below).
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

NODES=${ZOO_SLURM_NODES:-1}
if ((NODES > 1)); then DIR=${ZOO_SLURM_DIR:-/tmp/zoo-slurm-$NODES-nodes}; else DIR=${ZOO_SLURM_DIR:-/tmp/zoo-slurm}; fi
CPUS=${ZOO_SLURM_CPUS:-8}        # declared CPUs per node (may exceed the real cores: config_overrides)
CONF=$DIR/slurm.conf
HOSTS_MARK="# added by zoo .ci/slurm_setup.sh"
NODES_MARK="# a simulated node of zoo .ci/slurm_setup.sh"
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
# A node whose slurmd stops answering is marked not responding, then DOWN, after this many
# seconds (default 300): a job that keeps its allocation (sbatch --no-kill) restarts on the
# nodes left (tests/slurm/test_multinode.py).
SlurmdTimeout=10
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

# Several nodes. A bridge in the root namespace ($NET.1, the controller's address) and one
# veth into each node's namespace ($NET.(10+i)): a private range used on those links only, no
# default route, so nothing the jobs do leaves this machine. /etc/hosts names the nodes
# (marked lines, removed by `down`). slurmctld runs in the root namespace on non-default
# ports (a single-node cluster or a system Slurm can run beside it); each slurmd runs in its
# node's namespace with its own hostname (`unshare --uts`), entered with nsenter: `ip netns
# exec` mounts a fresh /sys without cgroups, where slurmd 22.05 fails with "No filesystem
# mounted on /sys/fs/cgroup". munged's socket is a path on the shared file system, so every
# namespace reaches it. Job tasks are the slurmds' children: they see their node's address.
NET=${ZOO_SLURM_NET:-10.231.7}
BRIDGE=zoo-slurm-br
CTL_PORT=6837
NODE_PORT=6838
node_name() { echo "zoo-node$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }
in_node() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

# A TCP round trip from node $1 to node $2 (there is no ping here): python3 listens in one
# namespace and answers, the other connects.
link_ok() {
    local a b port=6899
    a=$(node_name "$1"); b=$(node_name "$2")
    in_node "$b" timeout 5 python3 -c "
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$(node_addr "$2")', $port)); s.listen(1); c, _ = s.accept(); c.sendall(c.recv(4))" &
    local server=$!
    local ok=1
    for _ in $(seq 25); do
        if in_node "$a" timeout 2 python3 -c "
import socket; c = socket.create_connection(('$(node_addr "$2")', $port), timeout=1); c.sendall(b'zoo!')
assert c.recv(4) == b'zoo!'" 2>/dev/null; then ok=0; break; fi
        sleep 0.2
    done
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    return $ok
}

net_up() {
    command -v ip >/dev/null && command -v nsenter >/dev/null && command -v unshare >/dev/null \
        || cannot_install "several nodes need ip, nsenter and unshare"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge 2>/dev/null || cannot_install "cannot create a bridge (no CAP_NET_ADMIN?)"
        ip addr add "$NET.1/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    local i ns
    for i in $(seq "$NODES"); do
        ns=$(node_name "$i")
        [[ -e /run/netns/$ns ]] || ip netns add "$ns" || cannot_install "cannot create network namespace $ns"
        if ! ip link show "zoo-veth$i" >/dev/null 2>&1; then
            ip link add "zoo-veth$i" type veth peer name eth0 netns "$ns"
            ip link set "zoo-veth$i" master "$BRIDGE" up
            ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
            ip -n "$ns" link set eth0 up
        fi
        ip -n "$ns" link set lo up
        grep -q "^$(node_addr "$i") $ns " /etc/hosts || echo "$(node_addr "$i") $ns $NODES_MARK" >>/etc/hosts
    done
    link_ok 1 2 || die "no TCP round trip from $(node_name 1) to $(node_name 2) over $BRIDGE"
}

net_down() {
    local i ns
    for i in $(seq "$NODES"); do
        ns=$(node_name "$i")
        if [[ -e /run/netns/$ns ]]; then
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true  # tasks a killed slurmd left
            ip netns delete "$ns" 2>/dev/null || say "could not delete network namespace $ns"
        fi
        ip link delete "zoo-veth$i" 2>/dev/null || true
    done
    ip link delete "$BRIDGE" 2>/dev/null || true
}

write_nodes_conf() {
    local i
    sed -i -e "s/^SlurmctldHost=.*/SlurmctldHost=$HOST($NET.1)/" \
        -e "s|^SlurmdSpoolDir=.*|SlurmdSpoolDir=$DIR/spool/%n|" \
        -e "s|^SlurmdPidFile=.*|SlurmdPidFile=$DIR/pids/slurmd-%n.pid|" \
        -e "s|^SlurmdLogFile=.*|SlurmdLogFile=$DIR/log/slurmd-%n.log|" \
        -e '/^NodeName=/d' -e '/^PartitionName=/d' "$CONF"
    {
        echo "SlurmctldPort=$CTL_PORT"
        echo "SlurmdPort=$NODE_PORT"
        for i in $(seq "$NODES"); do
            echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=zoo-node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
    } >>"$CONF"
}

nodes_ready() {
    local i
    for i in $(seq "$NODES"); do
        HOST=$(node_name "$i") node_ready || return 1
    done
}

up_nodes() {
    mkdir -p "$DIR"/{state,log,pids}
    install_packages
    HOST=$(hostname -s)
    net_up
    start_munge
    if ! alive "$DIR/pids/slurmctld.pid"; then
        write_conf
        write_nodes_conf
        start_daemon slurmctld slurmctld -f "$CONF"
        poll controller_up || die_log "$DIR/log/slurmctld.log" "slurmctld does not answer"
        cancel_all_jobs
    fi
    local i ns
    for i in $(seq "$NODES"); do
        ns=$(node_name "$i")
        mkdir -p "$DIR/spool/$ns"
        alive "$DIR/pids/slurmd-$ns.pid" && continue
        in_node "$ns" unshare --uts sh -c "hostname $ns && exec slurmd -f $CONF -N $ns" \
            || die_log "$DIR/log/slurmd-$ns.log" "slurmd of $ns did not start"
        poll alive "$DIR/pids/slurmd-$ns.pid" || die_log "$DIR/log/slurmd-$ns.log" "slurmd of $ns wrote no pid file"
    done
    poll nodes_ready || die_log "$DIR/log/slurmctld.log" "the nodes are not idle $WAIT_S s after start: $(slurm_cmd sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    say "ready: $(slurm_cmd sinfo -h -o 'partition %P: %D nodes (%N), %c CPUs each, %T' | head -n 1)"
    echo "export SLURM_CONF=$CONF"
}

down_nodes() {
    if [[ -d $DIR/pids ]] && alive "$DIR/pids/slurmctld.pid"; then
        cancel_all_jobs
        poll no_jobs || say "jobs still listed $WAIT_S s after scancel: $(slurm_cmd squeue -h -o '%i %T' | tr '\n' ' ')"
    fi
    local rc=0 i
    for i in $(seq "$NODES"); do
        stop_pidfile "slurmd of $(node_name "$i")" "$DIR/pids/slurmd-$(node_name "$i").pid" || rc=1
    done
    stop_pidfile slurmctld "$DIR/pids/slurmctld.pid" || rc=1
    if [[ -s $DIR/pids/munged ]]; then
        stop_pidfile munged "$(cat "$DIR/pids/munged")" || rc=1
        rm -f "$DIR/pids/munged"
    fi
    net_down
    sed -i "\\|$NODES_MARK\$|d" /etc/hosts 2>/dev/null || true
    return $rc
}

up() {
    if ((NODES > 1)); then up_nodes; return; fi
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
    if ((NODES > 1)); then down_nodes; return; fi
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
    sed -i "\\|$HOSTS_MARK\$|d" /etc/hosts 2>/dev/null || true
    return $rc
}

status() {
    local names=(slurmctld slurmd) i
    if ((NODES > 1)); then
        names=(slurmctld)
        for i in $(seq "$NODES"); do names+=("slurmd-$(node_name "$i")"); done
    fi
    for name in "${names[@]}"; do
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
