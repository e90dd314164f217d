#!/bin/bash
# Submit the measuring gate (gbvalidate-gate.sbatch, beside this script) as an exclusive job on each idle node of a
# Slurm host list; a node running a job, or one taken out of service (drained, down, failed, in maintenance, or
# drained by a gate under way), is left alone and named. Run as root or a Slurm operator: the gate drains and
# resumes. Arguments after the list go to pytest:
#   gbvalidate-gate-submit.sh 'gpu-[001-016]' --gb-sku=ND_GB200_v6
# Prints a line per node: `NODE: submitted job N` or `NODE: left alone (STATE ...)`. Each call to slurmctld waits
# GBVALIDATE_SLURM_TIMEOUT_S seconds at most (default 5, as the health check's scontrol calls): a slurmctld that does
# not answer leaves the node alone, saying so, rather than the script hanging without a line.
set -uo pipefail
here="$(dirname -- "$(readlink -f -- "$0")")"
if [[ $# -lt 1 ]]; then
    echo "usage: $0 HOSTLIST [pytest arguments]" >&2
    exit 2
fi
list="$1"
shift
bound="${GBVALIDATE_SLURM_TIMEOUT_S:-5}"
nodes="$(timeout "$bound" scontrol show hostnames "$list")" || {
    echo "$0: scontrol show hostnames '$list' failed or gave no answer within ${bound} s" >&2
    exit 2
}
for node in $nodes; do
    state="$(timeout "$bound" scontrol show node -o "$node" | sed -n 's/.*[[:space:]]State=\([^[:space:]]*\).*/\1/p')"
    case "+${state}+" in
        *+DRAIN+* | *+DRAINED+* | *+DRAINING+* | *+DOWN+* | *+FAIL+* | *+FAILING+* | *+MAINT+* | *+RESERVED+* | ++)
            echo "$node: left alone (${state:-no state}: out of service, or no answer within ${bound} s)"
            continue
            ;;
    esac
    case "$state" in
        IDLE | IDLE+*)
            if ! job="$(timeout "$bound" sbatch --parsable -w "$node" "$here/gbvalidate-gate.sbatch" "$@")"; then
                echo "$node: not submitted (sbatch failed or gave no answer within ${bound} s)"
                continue
            fi
            echo "$node: submitted job ${job%%;*}"
            ;;
        *) echo "$node: left alone ($state: a job runs there)" ;;
    esac
done
