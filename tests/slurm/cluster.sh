#!/usr/bin/env bash
# A one-machine SLURM cluster for the tests (Debian's slurm-wlm and munge, as root): slurmctld and one slurmd
# on this host, a "debug" partition, job completions in a text file (sacct --completion reads it).
#   tests/slurm/cluster.sh start   -> prints `export SLURM_CONF=...` ; exits 3 with a one-line reason if it can't
#   tests/slurm/cluster.sh stop
set -euo pipefail
DIR=${SHARDBENCH_SLURM_DIR:-/tmp/shardbench-slurm}
CONF=$DIR/slurm.conf
why() { echo "slurm: $*" >&2; exit 3; }

start() {
  [ "$(id -u)" = 0 ] || why "needs root (slurmd and munged run as root here)"
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || why "no slurm-wlm and no apt-get to install it"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null; } \
      || why "apt-get install slurm-wlm failed"
  fi
  mkdir -p "$DIR"/{state,spool} /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c "munged" 2>/dev/null || munged --force \
    || why "munged would not start"
  local host cpus mem
  host=$(hostname -s); cpus=$(nproc); mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  cat > "$CONF" <<CONF
ClusterName=shardbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$CONF
  pgrep -x slurmctld >/dev/null || slurmctld -f "$CONF" || why "slurmctld would not start (see $DIR/slurmctld.log)"
  pgrep -x slurmd >/dev/null || slurmd -f "$CONF" || why "slurmd would not start (see $DIR/slurmd.log)"
  for _ in $(seq 60); do
    sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && { echo "export SLURM_CONF=$CONF"; return; }
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 0.5
  done
  why "the node never came up: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
}

stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
}

case "${1:-start}" in start) start ;; stop) stop ;; *) echo "usage: $0 start|stop" >&2; exit 2 ;; esac
