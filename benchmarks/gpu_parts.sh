# Shared by gpu_check.sh and gpu_check_offline.sh (sourced, not run): how a check runs its parts. Each part is
# one command in its own process under `timeout`; its log, last JSON line and status go to $LOGS, a failing part
# is reported and the next one runs. The sourcing script sets TAG (its name in messages), LOGS, WANTED (the
# --parts list, empty for all) and, for a time budget across parts, BUDGET_S.

fail() {  # the environment itself is wrong: nothing after this could run
    echo "$TAG: FAILED: $*" >&2
    exit 1
}

want() { [ -z "$WANTED" ] || [[ ",$WANTED," == *",$1,"* ]]; }

skip_part() {  # NAME WHY
    echo "$1" >>"$LOGS/parts"
    echo "skipped $2" >"$LOGS/$1.status"
    echo "$TAG: $1 skipped: $2"
}

run_part() {  # NAME LIMIT_S COMMAND...: within what is left of BUDGET_S, when set
    local name=$1 limit=$2 rc=0
    shift 2
    want "$name" || { skip_part "$name" "(not in --parts)"; return 0; }
    if [ -n "${BUDGET_S:-}" ]; then
        local left=$((BUDGET_S - SECONDS))
        [ "$left" -ge 20 ] || { skip_part "$name" "out of time ($BUDGET_S s budget spent)"; return 0; }
        [ "$limit" -le "$left" ] || limit=$left
    fi
    echo "$name" >>"$LOGS/parts"
    echo "$TAG: $name (at most $limit s) ..."
    timeout --kill-after=30 "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    { grep '^{' "$LOGS/$name.log" || true; } | tail -n 1 >"$LOGS/$name.json"
    case $rc in
        0) echo ok ;;
        124 | 137) echo "timeout after $limit s" ;;
        *) echo "failed, exit status $rc" ;;
    esac >"$LOGS/$name.status"
    if [ "$rc" -ne 0 ]; then
        tail -n 30 "$LOGS/$name.log" >&2
        echo "$TAG: $name FAILED ($(cat "$LOGS/$name.status"); whole log $LOGS/$name.log)" >&2
    fi
    return 0
}
