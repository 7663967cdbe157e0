#!/bin/sh
# The stand-in Redis image's entrypoint: the official image's Redis is built with protected mode off
# (in a container, the other containers are its clients); Debian's is not, so turn it off here.
if [ "$1" = redis-server ]; then
    shift
    exec redis-server --protected-mode no "$@"
fi
exec "$@"
