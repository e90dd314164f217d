#!/bin/bash
# pytest-gbvalidate's node health check for Slurm: one script for Prolog=, Epilog= and HealthCheckProgram=
# (README.md beside it has the slurm.conf lines). It runs
#   python -m pytest_gbvalidate.healthcheck slurm [--drain] [--deadline-s S] [--keep-report P] -- [pytest arguments]
# prints its one line (LBNL NHC's: `ERROR:  gbvalidate:  Health check failed:  CATEGORY (N checks); action: ...; checks: CATEGORY: CHECK`), logs it and exits
# with its status: 0 healthy, 1 a check failed, 142 past the deadline, 10 no verdict. As a Prolog or Epilog, where
# Slurm drains the node on any other status than 0, "no verdict" (our own failure: a setting, the interpreter, a
# report we cannot read) exits 0: it says nothing of the node, and nothing is drained for it.
#
# Settings: slurmd passes none of its environment to Prolog, Epilog or HealthCheckProgram, so they are read from
# the file beside this script with .conf for .sh (e.g. /etc/slurm/gbvalidate-healthcheck.conf), one KEY=VALUE a
# line, `#` comments. The file is read, never run, and must be writable by its owner only (root, or the user this
# runs as). A variable set in the environment (a run by hand) wins over the file. SETTINGS below has a row per
# setting, NAME|default|meaning: the keys the file may set, and what one unset or empty means.
set -u

# slurmd runs Prolog, Epilog and HealthCheckProgram without a search path (Slurm's prolog_epilog guide).
export PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SETTINGS=(
    "GBVALIDATE_PYTHON|python3|the Python with pytest-gbvalidate installed"
    "GBVALIDATE_DRAIN|1|1: a failed node drains itself through scontrol; 0: the exit status only"
    "GBVALIDATE_DRAIN_LOG|/var/lib/gbvalidate/drains.json|the node's drains, kept: one drained more than once in 7
        days drains as a repeat offender ([repeat]), which only a person resumes; none: not kept"
    "GBVALIDATE_DRAIN_METRICS||after each check, the drain log's counts as a Prometheus text file here (in
        node_exporter's textfile directory: gbvalidate_node_drains, ..._last_drain_timestamp_seconds)"
    "GBVALIDATE_SHADOW|0|1: shadow mode, to trial the check: run, judged and logged, nothing drained or resumed, exit
        0 (the line says what would have been done: would drain NODE); 0: the check acts"
    "GBVALIDATE_CONFIRM|1|1: failed checks run once more within the deadline, only what fails again counts (a check
        that then passes is flapping, not drained); 0: one run"
    "GBVALIDATE_LEVEL|passive|passive: the checks that measure nothing, fit beside a job; quick: a short copy, GEMM
        and all_reduce too"
    "GBVALIDATE_DEADLINE_S||seconds the checks may take (none: 45 passive, 90 quick; within slurmd's limit less 20 s:
        HealthCheckTimeout, 60 before Slurm 26.05; PrologEpilogTimeout where set)"
    "GBVALIDATE_KEEP_REPORT||keep the last run's JSON report here"
    "GBVALIDATE_PYTEST_ARGS||more pytest arguments, split at spaces, e.g. --gb-sku=ND_GB200_v6"
    "GBVALIDATE_LOG_FILE||also append each line, dated, to this file; never through a symbolic link, and only in a
        directory no one but root (or this user) may write in"
    "GBVALIDATE_SYSLOG|1|1: also send the line to syslog with logger(1)"
)
setting_names=()
declare -A setting_default=()
for row in "${SETTINGS[@]}"; do
    IFS='|' read -r name value _ <<<"$row"
    setting_names+=("$name")
    setting_default[$name]=$value
done

# A setting's value: the environment's or the file's, else (unset or empty) its default.
setting() {
    local name=$1
    printf '%s' "${!name:-${setting_default[$name]}}"
}

conf="${GBVALIDATE_CONF:-${0%.sh}.conf}"

# Whether the log file may be appended to as root: no symbolic link (root would append to whatever it names), a
# regular file where it exists, in a directory owned by root or us that nobody else may write in (else another
# account could put a link there between this check and the write). Where not, the line goes to syslog, saying so.
log_file_safe() {
    local file=$1 directory downer dmode
    directory="$(dirname -- "$file")"
    read -r downer dmode < <(stat -c '%u %a' -- "$directory" 2>/dev/null) || downer=""
    if [[ -L "$file" ]] || { [[ -e "$file" ]] && ! [[ -f "$file" ]]; } || [[ -z "$downer" ]] ||
        [[ "$downer" != 0 && "$downer" != "$(id -u)" ]] || (((8#$dmode & 8#022) != 0)); then
        logger -t gbvalidate-healthcheck -- "GBVALIDATE_LOG_FILE=$file: not written (a symbolic link, not a regular" \
            "file, or in a directory others may write in)" 2>/dev/null || true
        return 1
    fi
}

# The line, printed and logged; the status, with "no verdict" made 0 where Slurm would drain for it.
finish() {
    local line status=$2 log_file
    line="$(printf '%s' "$1" | tr -c '[:print:]' ' ' | cut -c1-1000)"
    echo "$line"
    log_file="$(setting GBVALIDATE_LOG_FILE)"
    if [[ -n "$log_file" ]] && log_file_safe "$log_file"; then
        echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) ${SLURMD_NODENAME:-$(hostname -s)} $line" >>"$log_file" 2>/dev/null
    fi
    if [[ "$(setting GBVALIDATE_SYSLOG)" == "1" ]]; then
        logger -t gbvalidate-healthcheck -- "$line" 2>/dev/null || true
    fi
    case "${SLURM_SCRIPT_CONTEXT:-}:$status" in
        prolog_slurmd:0 | prolog_slurmd:1 | prolog_slurmd:142 | epilog_slurmd:0 | epilog_slurmd:1 | epilog_slurmd:142) ;;
        prolog_slurmd:* | epilog_slurmd:*) status=0 ;;
    esac
    exit "$status"
}

no_verdict() {
    finish "ERROR:  gbvalidate:  Health check could not run:  $1" 10
}

# The settings file: a regular file (a directory or a FIFO would fail or hang the read), owned by root or by us,
# writable by its owner only, KEY=VALUE lines of known keys, each set once, with Unix line ends.
if [[ -e "$conf" || -L "$conf" ]]; then
    [[ -f "$conf" ]] || no_verdict "$conf: not a regular file"
    read -r owner mode < <(stat -L -c '%u %a' -- "$conf" 2>/dev/null) || no_verdict "$conf: cannot be read"
    if [[ "$owner" != 0 && "$owner" != "$(id -u)" ]] || (((8#$mode & 8#022) != 0)); then
        no_verdict "$conf: owned by uid $owner with mode $mode: it must be writable by root (or uid $(id -u)) only"
    fi
    number=0
    declare -A first_line=()
    while IFS= read -r text || [[ -n "$text" ]]; do
        number=$((number + 1))
        if [[ "$text" == *$'\r'* ]]; then
            no_verdict "$conf: line $number: ends in a carriage return (Windows line ends: convert with dos2unix)"
        fi
        [[ "$text" =~ ^[[:space:]]*(#.*)?$ ]] && continue
        if ! [[ "$text" =~ ^[[:space:]]*([A-Z_]+)=(.*)$ ]]; then
            no_verdict "$conf: line $number: not KEY=VALUE"
        fi
        key="${BASH_REMATCH[1]}" value="${BASH_REMATCH[2]}"
        if [[ -z "${setting_default[$key]+known}" ]]; then
            no_verdict "$conf: line $number: unknown setting $key (known: ${setting_names[*]})"
        fi
        if [[ -n "${first_line[$key]:-}" ]]; then
            no_verdict "$conf: line $number: $key is set again (first on line ${first_line[$key]}): which one holds?"
        fi
        first_line[$key]=$number
        if [[ "$value" =~ ^\"(.*)\"$ || "$value" =~ ^\'(.*)\'$ ]]; then
            value="${BASH_REMATCH[1]}"
        fi
        if [[ -z "${!key+set}" ]]; then
            declare "$key=$value"
        fi
    done <"$conf"
fi

python="$(setting GBVALIDATE_PYTHON)"
level="$(setting GBVALIDATE_LEVEL)"
case "$level" in
    passive | quick) args=(slurm --level "$level") ;;
    *) no_verdict "GBVALIDATE_LEVEL=$level: expected passive or quick" ;;
esac
# The plugin reads GBVALIDATE_LEVEL too (--gb-level): the health check names the level itself.
unset GBVALIDATE_LEVEL
deadline_s="$(setting GBVALIDATE_DEADLINE_S)"
if [[ -n "$deadline_s" ]]; then
    args+=(--deadline-s "$deadline_s")
fi
drain="$(setting GBVALIDATE_DRAIN)"
case "$drain" in
    1) args+=(--drain) ;;
    0) ;;
    *) no_verdict "GBVALIDATE_DRAIN=$drain: expected 1 or 0" ;;
esac
drain_log="$(setting GBVALIDATE_DRAIN_LOG)"
if [[ "$drain" == "1" && "$drain_log" != "none" ]]; then # kept where the check drains
    args+=(--drain-log "$drain_log")
    drain_metrics="$(setting GBVALIDATE_DRAIN_METRICS)"
    if [[ -n "$drain_metrics" ]]; then
        args+=(--drain-metrics "$drain_metrics")
    fi
fi
shadow="$(setting GBVALIDATE_SHADOW)"
case "$shadow" in
    1) args+=(--shadow) ;;
    0) ;;
    *) no_verdict "GBVALIDATE_SHADOW=$shadow: expected 1 or 0" ;;
esac
confirm="$(setting GBVALIDATE_CONFIRM)"
case "$confirm" in
    1) ;;
    0) args+=(--no-confirm) ;;
    *) no_verdict "GBVALIDATE_CONFIRM=$confirm: expected 1 or 0" ;;
esac
keep_report="$(setting GBVALIDATE_KEEP_REPORT)"
if [[ -n "$keep_report" ]]; then
    args+=(--keep-report "$keep_report")
fi
read -r -a extra <<<"$(setting GBVALIDATE_PYTEST_ARGS)"

# In a Prolog or Epilog, CUDA_VISIBLE_DEVICES names the job's GPUs only; the check is of the whole node.
case "${SLURM_SCRIPT_CONTEXT:-}" in
    prolog_slurmd | epilog_slurmd) unset CUDA_VISIBLE_DEVICES ;;
esac

output="$("$python" -m pytest_gbvalidate.healthcheck "${args[@]}" -- ${extra[@]+"${extra[@]}"} 2>&1)"
status=$?
line="$(grep -E '^(ERROR:  )?gbvalidate:  ' <<<"$output" | tail -n 1)"
if [[ -z "$line" ]]; then # the command did not run: what it said last names the cause
    said="$(grep -v '^[[:space:]]*$' <<<"$output" | tail -n 1)"
    no_verdict "$python -m pytest_gbvalidate.healthcheck exited $status: ${said:-no output} (GBVALIDATE_PYTHON in $conf)"
fi
finish "$line" "$status"
