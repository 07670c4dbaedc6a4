# Sourced by scripts/test (after bootstrap.sh): make the Docker tests runnable where that can be
# done, or say why not.
#   - A Docker engine already answers: use it, and leave it running.
#   - Otherwise, as root on Debian with apt: install what is missing of docker.io, docker-compose
#     and busybox-static (apt-get), start dockerd in the background, and stop it when scripts/test
#     exits (the EXIT trap; not while another scripts/test run still uses it).
#   - Then build the local image gradfed-ipfs/kubo:v0.43.1 (scripts/build-kubo-image; cached).
# When the Docker tests cannot run, GRADFED_DOCKER_UNAVAILABLE holds the reason: the tests skip
# with it and the pytest summary prints it. GRADFED_DOCKER=0 skips all of this.
# Docker Hub is never needed: the image is built from the local Kubo binary with no pull.

GRADFED_DOCKER_STATE="${GRADFED_DOCKER_STATE:-/run/gradfed-ipfs-docker}"
_gradfed_docker_registered=""

_docker_say() {
    echo "docker: $*" >&2
}

_docker_unavailable() {
    export GRADFED_DOCKER_UNAVAILABLE="$*"
    _docker_say "the Docker tests will skip: $*"
}

_docker_answers() {
    command -v docker >/dev/null 2>&1 && timeout 20 docker version >/dev/null 2>&1
}

_docker_compose_works() {
    timeout 20 docker compose version >/dev/null 2>&1 \
        || timeout 20 docker-compose version >/dev/null 2>&1
}

_docker_static_busybox() {
    local candidate
    for candidate in /bin/busybox /usr/bin/busybox; do
        if [[ -x "$candidate" ]] && ! ldd "$candidate" >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

_docker_can_apt() {
    [[ $EUID -eq 0 && -r /etc/debian_version ]] && command -v apt-get >/dev/null 2>&1
}

_docker_alive() {  # a live process (a zombie nobody has reaped yet does not count)
    [[ -r "/proc/$1/stat" ]] && [[ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

_docker_apt_install() {
    local log="${TMPDIR:-/tmp}/gradfed-docker-apt.log" started=$SECONDS
    _docker_say "installing $* with apt-get (first time only; log: $log)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "$@" >"$log" 2>&1; then
        apt-get update >>"$log" 2>&1 || true
        apt-get install -y --no-install-recommends "$@" >>"$log" 2>&1 || {
            tail -n 5 "$log" >&2
            return 1
        }
    fi
    _docker_say "installed $* in $((SECONDS - started))s"
}

_docker_start_dockerd() {  # under the lock; sets the reason and returns 1 on failure
    local log="${TMPDIR:-/tmp}/gradfed-dockerd.log" started=$SECONDS pid driver
    for driver in "" vfs; do  # dockerd's own choice (overlay2 where it works), else vfs
        _docker_say "starting dockerd${driver:+ with --storage-driver=$driver} (log: $log)"
        # setsid: Ctrl-C in the terminal reaches scripts/test, whose trap stops dockerd cleanly.
        setsid dockerd --exec-opt native.cgroupdriver=cgroupfs ${driver:+--storage-driver=$driver} \
            >"$log" 2>&1 </dev/null &
        pid=$!
        while _docker_alive "$pid" && ! _docker_answers && ((SECONDS - started < 60)); do
            sleep 0.2  # polling a daemon's readiness: nothing to wait on instead
        done
        if _docker_answers; then
            echo "$pid" >"$GRADFED_DOCKER_STATE/dockerd.pid"
            _docker_say "dockerd (pid $pid) answers after $((SECONDS - started))s"
            return 0
        fi
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        tail -n 3 "$log" >&2
    done
    _docker_unavailable "dockerd did not start (see $log)"
    return 1
}

gradfed_docker_setup() {
    if [[ "${GRADFED_DOCKER:-1}" == 0 ]]; then
        _docker_unavailable "GRADFED_DOCKER=0"
        return 0
    fi
    if ! _docker_answers && ! _docker_can_apt; then
        _docker_unavailable "no Docker engine answers, and this is not Debian with apt-get as root"
        return 0
    fi
    if _docker_can_apt; then
        local missing=()
        command -v dockerd >/dev/null 2>&1 || _docker_answers || missing+=(docker.io)
        _docker_compose_works || missing+=(docker-compose)
        _docker_static_busybox || missing+=(busybox-static)
        if ((${#missing[@]})) && ! _docker_apt_install "${missing[@]}"; then
            _docker_unavailable "apt-get install ${missing[*]} failed"
            return 0
        fi
        # Register as a user of the engine under the lock, so that a run ending meanwhile does
        # not stop a dockerd that scripts/test started while this run still needs it.
        mkdir -p "$GRADFED_DOCKER_STATE/users"
        exec {_gradfed_docker_lock}>"$GRADFED_DOCKER_STATE/lock"
        flock "$_gradfed_docker_lock"
        touch "$GRADFED_DOCKER_STATE/users/$$"
        _gradfed_docker_registered=1
        trap gradfed_docker_teardown EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        if ! _docker_answers && ! _docker_start_dockerd; then
            flock -u "$_gradfed_docker_lock"
            return 0
        fi
        flock -u "$_gradfed_docker_lock"
    fi
    if [[ -n "${GRADFED_KUBO_IMAGE:-}" ]]; then
        _docker_say "using GRADFED_KUBO_IMAGE=$GRADFED_KUBO_IMAGE (not building the local image)"
    elif ! _docker_static_busybox; then
        _docker_unavailable "no static busybox for the image (Debian: apt-get install busybox-static)"
    else
        "$ROOT/scripts/build-kubo-image" >/dev/null
    fi
}

gradfed_docker_teardown() {  # the EXIT trap: stop dockerd if scripts/test started it and is done
    [[ -n "$_gradfed_docker_registered" ]] || return 0
    flock "$_gradfed_docker_lock"
    rm -f "$GRADFED_DOCKER_STATE/users/$$"
    local user pid users=0
    for user in "$GRADFED_DOCKER_STATE"/users/*; do
        [[ -e "$user" ]] || continue
        if _docker_alive "${user##*/}"; then
            users=$((users + 1))
        else
            rm -f "$user"  # a run that died without its trap
        fi
    done
    if ((users == 0)) && [[ -f "$GRADFED_DOCKER_STATE/dockerd.pid" ]]; then
        pid="$(cat "$GRADFED_DOCKER_STATE/dockerd.pid")"
        if _docker_alive "$pid"; then
            kill -TERM "$pid"
            local deadline=$((SECONDS + 30))
            while _docker_alive "$pid" && ((SECONDS < deadline)); do
                sleep 0.2  # dockerd stops its containers and containerd, then exits
            done
            _docker_alive "$pid" && kill -KILL "$pid"
            _docker_say "stopped dockerd (pid $pid), which scripts/test had started"
        fi
        rm -f "$GRADFED_DOCKER_STATE/dockerd.pid"
    fi
    flock -u "$_gradfed_docker_lock"
}
