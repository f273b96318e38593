#version 450
// Rotary embedding in place on rows of a pool bound as up to four windows (rope.glsl).
#define KV_WINDOWED
#include "rope.glsl"
