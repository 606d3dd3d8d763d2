# wait_until SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds (0) or SECONDS have
# passed (1). A deadline, not a count of tries: on a loaded machine a start takes longer, and the
# checks must wait for it, not fail by chance. Sourced.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}
