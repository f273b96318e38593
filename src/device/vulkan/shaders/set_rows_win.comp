#version 450
// KV rows written into a pool bound as up to four windows (set_rows.glsl).
#define KV_WINDOWED
#include "set_rows.glsl"
