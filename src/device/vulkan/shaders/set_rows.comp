#version 450
// KV rows written into a pool that fits one storage-buffer window (set_rows.glsl).
#include "set_rows.glsl"
