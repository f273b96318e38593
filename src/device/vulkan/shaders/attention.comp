#version 450
// Paged attention over K/V pools that fit one storage-buffer window (attention.glsl).
#include "attention.glsl"
