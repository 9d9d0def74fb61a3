# Sourced by scripts that start `hstu-replay server serve` in the background.
# wait_until_serving LOG PID SECONDS: returns once the server says it serves; exits the calling
# script (printing the log's tail) if the server dies or is not ready within SECONDS.
wait_until_serving() {
    local log=$1 pid=$2 seconds=$3 i
    for i in $(seq 1 $((seconds * 2))); do
        grep -q "hstu-replay: serving" "$log" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -20 "$log"; exit 1; }
        sleep 0.5
    done
    echo "the server did not become ready in $seconds s"; tail -20 "$log"; exit 1
}
