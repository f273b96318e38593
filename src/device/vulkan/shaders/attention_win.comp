#version 450
// Paged attention over K/V pools bound as up to four windows each (attention.glsl).
#define KV_WINDOWED
#include "attention.glsl"
