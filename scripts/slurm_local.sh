#!/usr/bin/env bash
# A single-node Slurm on loopback for tests: munged, slurmctld and slurmd started in the foreground
# of this script's children, their pids written to DIR/pids, stopped by those pids only.
#
#   scripts/slurm_local.sh start DIR    # prints the partition name on success ("debug")
#   scripts/slurm_local.sh stop DIR
#
# Everything (key, config, state, logs, sockets) lives under DIR; nothing under /etc is touched.
# The daemons run as the current user (SlurmUser = SlurmdUser = it); cgroups are not used
# (proctrack/linuxproc, task/none), so it also runs in containers without a cgroup mount.
set -euo pipefail
cmd=${1:?start|stop}
dir=$(realpath -m "${2:?state folder}")
node=$(hostname -s)
user=$(id -un)

stop() {
  [ -f "$dir/pids" ] || return 0
  # let running jobs end first: a slurmd killed under a finishing step leaves its slurmstepd behind
  export SLURM_CONF="$dir/slurm.conf"
  for _ in $(seq 60); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
  scancel --user="$user" 2>/dev/null || true
  for _ in $(seq 60); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
  while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$dir/pids"
  sleep 1
  while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$dir/pids"
  rm -f "$dir/pids"
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

mkdir -p "$dir"/{munge,state,spool,log}
chmod 700 "$dir/munge"
[ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
ctl_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
d_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 3 / 4 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=evalmtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
echo "$dir/slurm.conf"
: > "$dir/pids"
munged --foreground --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" \
  > "$dir/log/munged.out" 2>&1 < /dev/null &
echo $! >> "$dir/pids"
for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
export SLURM_CONF="$dir/slurm.conf"
slurmctld -D -i -f "$dir/slurm.conf" > "$dir/log/slurmctld.out" 2>&1 < /dev/null &
echo $! >> "$dir/pids"
slurmd -D -f "$dir/slurm.conf" -N "$node" > "$dir/log/slurmd.out" 2>&1 < /dev/null &
echo $! >> "$dir/pids"
for _ in $(seq 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then echo debug; exit 0; fi
  sleep 1
done
echo "slurm did not come up; logs in $dir/log" >&2
stop
exit 1
