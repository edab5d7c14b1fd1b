/* Conflux: umbrella header. */
#ifndef CONFLUX_H
#define CONFLUX_H

#include <conflux/version.h>
#include <conflux/status.h>
#include <conflux/mem.h>
#include <conflux/context.h>
#include <conflux/object.h>
#include <conflux/reduce.h>
#include <conflux/group.h>
#include <conflux/ps.h>
#include <conflux/task.h>

#endif
