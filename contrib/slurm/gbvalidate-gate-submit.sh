#!/bin/bash
# Submit the measuring gate (gbvalidate-gate.sbatch, beside this script) as an exclusive job on each idle node of a
# Slurm host list; a node running a job, or one taken out of service (drained, down, failed, in maintenance, or
# drained by a gate under way), is left alone and named. Run as root or a Slurm operator: the gate drains and
# resumes. Arguments after the list go to pytest:
#   gbvalidate-gate-submit.sh 'gpu-[001-016]' --gb-sku=ND_GB200_v6
# Prints a line per node: `NODE: submitted job N` or `NODE: left alone (STATE ...)`.
set -uo pipefail
here="$(dirname -- "$(readlink -f -- "$0")")"
if [[ $# -lt 1 ]]; then
    echo "usage: $0 HOSTLIST [pytest arguments]" >&2
    exit 2
fi
list="$1"
shift
nodes="$(scontrol show hostnames "$list")" || exit 2
for node in $nodes; do
    state="$(scontrol show node -o "$node" | sed -n 's/.*[[:space:]]State=\([^[:space:]]*\).*/\1/p')"
    case "+${state}+" in
        *+DRAIN+* | *+DRAINED+* | *+DRAINING+* | *+DOWN+* | *+FAIL+* | *+FAILING+* | *+MAINT+* | *+RESERVED+* | ++)
            echo "$node: left alone (${state:-no state}: out of service, or no answer)"
            continue
            ;;
    esac
    case "$state" in
        IDLE | IDLE+*)
            job="$(sbatch --parsable -w "$node" "$here/gbvalidate-gate.sbatch" "$@")" || continue
            echo "$node: submitted job ${job%%;*}"
            ;;
        *) echo "$node: left alone ($state: a job runs there)" ;;
    esac
done
