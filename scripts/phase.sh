# Phases of a long shell script, each said as it starts, with the time since the script began,
# and run with a live clock: on a terminal one line redrawn every second; elsewhere (CI, logs)
# a "still ..." line every $PHASE_TICK seconds (default 30). A failed phase prints its output's
# last lines and stops the script. Sourced by scripts/setup.sh:
#     . scripts/phase.sh; run_phase "installing the project" pip install -e .
PHASE_T0=${PHASE_T0:-$SECONDS}

_clock() { local s=$(( $1 )); printf '%d:%02d' $((s / 60)) $((s % 60)); }

say() { printf '[%s] %s\n' "$(_clock $((SECONDS - PHASE_T0)))" "$*"; }

run_phase() {
    local what="$1" t0=$SECONDS log pid last=$SECONDS
    shift
    log=$(mktemp)
    say "$what"
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ -t 1 ]; then
            printf '\r\033[K  %s ... %s' "$what" "$(_clock $((SECONDS - t0)))"
        elif [ $((SECONDS - last)) -ge "${PHASE_TICK:-30}" ]; then
            last=$SECONDS
            say "  still $what ($(_clock $((SECONDS - t0))))"
        fi
        sleep 1
    done
    [ -t 1 ] && printf '\r\033[K'
    if wait "$pid"; then
        say "  done: $what in $(_clock $((SECONDS - t0)))"
        rm -f "$log"
    else
        say "  FAILED: $what; its last lines:" >&2
        tail -n 40 "$log" >&2
        rm -f "$log"
        exit 1
    fi
}
