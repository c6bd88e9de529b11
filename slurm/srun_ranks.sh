# Sourced by the slurm/*.sbatch scripts (in the batch shell): `srun_ranks OVERRIDES...` starts
# one `python -m zoo.train` rank per Slurm task and requeues the job when the ranks ask for it.
#
# Requeue protocol. The sbatch scripts ask for `--signal=B:USR1@120`: about 120 s before the
# time limit (Slurm may send it up to 60 s earlier still) Slurm signals this batch shell only
# (`B:`), not the ranks. The trap below forwards the signal to srun, which relays it to every
# task. The ranks agree to stop after the same step, write a checkpoint together and exit with
# ZOO_EXIT_REQUEUE (75); srun returns it and this shell runs `scontrol requeue`. The job keeps
# its id, so it comes back to the same run directory (outputs/slurm-<job id>) and, seeing
# SLURM_RESTART_COUNT > 0, resumes there with `resume=auto`. To warn a running job by hand
# (before a preemption, in a test):
#   scancel --signal=USR1 --batch <job id>
# Without --batch Slurm signals the ranks directly; that works too, the trainer reacts the same.

ZOO_EXIT_REQUEUE=75   # the trainer's exit code for "checkpoint written, run me again" (EX_TEMPFAIL)

srun_ranks() {
    local python=${ZOO_PYTHON:-python}
    local -a overrides
    local arg has_run_dir=0 has_resume=0 has_layout=0 srun_pid="" rc max_restarts=0 attempt=0
    # At once: an untrapped USR1 would end this shell, and with it the job. A signal that comes
    # before srun has started its tasks is lost (srun cannot relay it yet).
    trap 'echo "zoo: warning signal: asking the ranks to checkpoint"
          [[ -z $srun_pid ]] || kill -USR1 "$srun_pid" 2>/dev/null || true' USR1
    overrides=()
    for arg in "$@"; do
        case $arg in
            # In-job restarts: read here (the ranks are started again by this shell), not by zoo.train
            run.max_restarts=* | +run.max_restarts=* | ++run.max_restarts=*) max_restarts=${arg#*=}; continue ;;
        esac
        overrides+=("$arg")
        case $arg in
            hydra.run.dir=* | +hydra.run.dir=* | ++hydra.run.dir=*) has_run_dir=1 ;;
            resume=* | +resume=* | ++resume=*) has_resume=1 ;;
            parallel=* | +parallel=* | ++parallel=* | parallel.dp=* | experiment=* | +experiment=*) has_layout=1 ;;
        esac
    done
    # No layout chosen (no parallel=..., no experiment pinning one): planned for the allocation
    # (parallel=auto), again at every start, so a job requeued onto other or fewer nodes
    # continues its checkpoint on a layout made for them. Layout keys given (parallel.tp=2) are kept.
    ((has_layout)) || overrides+=("parallel=auto")
    # Keyed by the job id, which a requeued job keeps: it finds its own checkpoints.
    ((has_run_dir)) || overrides+=("hydra.run.dir=outputs/slurm-${SLURM_JOB_ID}")
    if ((${SLURM_RESTART_COUNT:-0} > 0 && !has_resume)); then
        overrides+=("resume=auto")
    fi

    if ! [[ $max_restarts =~ ^[0-9]+$ ]]; then
        echo "zoo: error: run.max_restarts=$max_restarts must be an integer >= 0 (restarts of the ranks inside the job)" >&2
        return 2
    fi
    # The ranks: one per task of each node the job has now. SLURM_NTASKS is kept from the
    # submission in the job's environment, also when a requeued job was moved onto other
    # nodes (scontrol update NumNodes=...); the nodes and the tasks per node are the allocation's.
    local ntasks=$SLURM_NTASKS per_node=""
    if [[ ${SLURM_NTASKS_PER_NODE:-} =~ ^[0-9]+$ && ${SLURM_JOB_NUM_NODES:-} =~ ^[0-9]+$ ]]; then
        per_node=$SLURM_NTASKS_PER_NODE
        ntasks=$((SLURM_JOB_NUM_NODES * per_node))
    fi
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
    # The ranks' malloc on CPU nodes (run.cpu_allocator, zoo/run/allocator.py: tcmalloc where
    # installed, LD_PRELOAD and its settings exported here; srun passes them on). A bad value
    # ends the job here with zoo's one line.
    local malloc_env
    malloc_env=$("$python" -m zoo.run.allocator "${overrides[@]}") || return 2
    eval "$malloc_env"
    export PYTHONUNBUFFERED=1
    # zoo.run.launch takes the master from the allocation's first host and the port from the job
    # id; the address is looked up once here so that N ranks do not each ask slurmctld.
    local hosts nodelist=$SLURM_JOB_NODELIST
    local -a where=()
    hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
    export MASTER_ADDR=${hosts%%$'\n'*}
    export ZOO_MAX_RESTARTS=$max_restarts

    echo "zoo: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST}: ${ntasks} ranks," \
         "${OMP_NUM_THREADS} threads each, master ${MASTER_ADDR}; overrides: ${overrides[*]}"
    while :; do
        export ZOO_ATTEMPT=$attempt

        # Since Slurm 22.05 srun no longer inherits --cpus-per-task from sbatch: pass it on.
        # --wait: a hung rank (stopped, deadlocked) would keep srun waiting to the time limit after
        # the others timed out (parallel.timeout_s) and exited; srun ends the tasks still running
        # ZOO_SRUN_WAIT seconds after the first one exits. The ranks of a run that ends well leave
        # together (a barrier after rank 0's last writes), and a requeue's exit 75 comes from all of
        # them at once, so neither is cut short. (--kill-on-bad-exit would end the others at the
        # first exit 75 too, and srun would then not return 75: no requeue.)
        srun --ntasks="$ntasks" --cpus-per-task="$OMP_NUM_THREADS" --wait="${ZOO_SRUN_WAIT:-60}" "${where[@]}" \
            "$python" -m zoo.train "${overrides[@]}" &
        srun_pid=$!
        # bash runs a trap only between commands, so srun runs in the background and we wait.
        while kill -0 "$srun_pid" 2>/dev/null; do
            wait "$srun_pid" || true    # returns early whenever the trap runs
        done
        wait "$srun_pid" && rc=0 || rc=$?    # srun's own exit status (bash kept it)
        srun_pid=""
        # In-job restart (run.max_restarts): a rank or a node failed (not a config error 2, a diverged
        # loss 3, a requeue 75 or a signal): the ranks start again, on the job's nodes that still
        # answer (the job must keep its allocation when a node fails: sbatch --no-kill), resuming
        # the newest checkpoint; parallel=auto plans again for the ranks there are.
        case $rc in 0 | 2 | 3 | 75 | 130 | 143) break ;; esac
        ((attempt < max_restarts)) || {
            ((max_restarts == 0)) || echo "zoo: error: srun exited ${rc} on attempt $((attempt + 1)) of" \
                "$((max_restarts + 1)): run.max_restarts=${max_restarts} spent, the job ends" >&2
            break
        }
        nodelist=$(zoo_nodes_up "$nodelist")
        if [[ -z $nodelist ]]; then
            echo "zoo: error: srun exited ${rc} and none of the job's nodes answers: no restart" >&2
            break
        fi
        attempt=$((attempt + 1))
        hosts=$(scontrol show hostnames "$nodelist")
        export MASTER_ADDR=${hosts%%$'\n'*}
        local count
        count=$(wc -l <<<"$hosts")
        [[ -z $per_node ]] || ntasks=$((count * per_node))
        # --overlap: the failed step keeps its CPUs on the nodes left until the lost node's part of it
        # is cleaned up, which never comes (Slurm: "Requested nodes are busy" until the job ends)
        where=(--nodes="$count" --nodelist="$nodelist" --overlap)
        ((has_resume)) || { overrides+=("resume=auto"); has_resume=1; }
        echo "zoo: srun exited ${rc}; restart ${attempt} of ${max_restarts} (run.max_restarts) on ${nodelist}" \
             "(${count} node(s) answering, ${ntasks} ranks, master ${MASTER_ADDR}): the ranks resume the newest checkpoint"
    done
    trap - USR1

    # Only on the trainer's code: it wrote a checkpoint after at least one more step, so every
    # requeue makes progress. Ranks killed by the signal itself (it came before the trainer
    # could take it) fail the job rather than restart it in a loop.
    if ((rc == ZOO_EXIT_REQUEUE)); then
        echo "zoo: requeueing job ${SLURM_JOB_ID} (srun exit ${rc})"
        scontrol requeue "$SLURM_JOB_ID"
        sleep 60    # the requeue ends this script at once; do not race it by exiting first
    fi
    return "$rc"
}

# The nodes of NODELIST that answer (not down, drained or failing, and not marked `*`, not
# responding), as a comma-separated list; the job keeps them while it runs (sbatch --no-kill).
zoo_nodes_up() {
    local node state up=()
    while read -r node state; do
        [[ -n $node ]] || continue
        case $state in *'*'* | down* | drain* | fail* | maint*) continue ;; esac
        up+=("$node")
    done < <(sinfo -h -N -n "$1" -o "%N %t" 2>/dev/null | sort -u)
    local IFS=,
    echo "${up[*]}"
}
