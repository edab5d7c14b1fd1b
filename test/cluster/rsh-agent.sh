#!/bin/sh
# Remote shell for mpirun on the emulated cluster (--mca plm_rsh_agent):
# Open MPI calls it like ssh, "rsh-agent.sh [options] HOST CMD...", and it
# runs CMD in the namespace of node HOST instead of logging in anywhere.
exec "$(dirname "$0")/cluster.sh" rsh "$@"
