#!/usr/bin/env bash
# A one-machine SLURM cluster for the tests (Debian's slurm-wlm and munge, as root): slurmctld and two slurmd on
# this host, nodes n1 and n2 (one core each, 127.0.0.1 in /etc/hosts), so that a 2-node job forms; a "debug"
# partition; job completions in a text file (sacct --completion reads it); a requeued job eligible again after
# 10 s, not SLURM's default 120 s (cred_expire), so that the preemption drill's requeue is quick.
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
  mkdir -p "$DIR"/{state,spool.n1,spool.n2} /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c "munged" </dev/null >/dev/null 2>&1 \
    || munged --force </dev/null >/dev/null 2>&1 || why "munged would not start"
  local host cpus mem
  host=$(hostname -s); cpus=$(( $(nproc) / 2 )); [ "$cpus" -ge 1 ] || cpus=1
  mem=$(( ($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024) / 2 ))
  for n in n1 n2; do grep -qE "^127\.0\.0\.1[[:space:]].*\b$n\b" /etc/hosts || echo "127.0.0.1 $n" >> /etc/hosts; done
  cat > "$CONF" <<CONF
ClusterName=shardbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job may start again cred_expire s later (SLURM's default is 120 s): the preemption drill
AuthInfo=cred_expire=10
SlurmctldPort=16817
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool.%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.%n.log
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
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=16821 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=16822 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$CONF
  pgrep -f "slurmctld -f $CONF" >/dev/null || slurmctld -f "$CONF" </dev/null >/dev/null 2>&1 \
    || why "slurmctld would not start (see $DIR/slurmctld.log)"
  for n in n1 n2; do
    pgrep -f "slurmd -f $CONF -N $n" >/dev/null || slurmd -f "$CONF" -N $n </dev/null >/dev/null 2>&1 \
      || why "slurmd $n would not start (see $DIR/slurmd.$n.log)"
  done
  for _ in $(seq 60); do
    [ "$(timeout 5 sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" = 2 ] \
      && { echo "export SLURM_CONF=$CONF"; return; }
    timeout 5 scontrol update nodename=n1,n2 state=resume >/dev/null 2>&1 || true
    sleep 0.5
  done
  why "the nodes never came up: $(timeout 5 sinfo -h -N -o '%N %T %E' 2>&1 | head -2 | paste -sd';')"
}

stop() {
  pkill -f "slurmd -f $CONF" 2>/dev/null || true
  pkill -f "slurmctld -f $CONF" 2>/dev/null || true
}

case "${1:-start}" in start) start ;; stop) stop ;; *) echo "usage: $0 start|stop" >&2; exit 2 ;; esac
