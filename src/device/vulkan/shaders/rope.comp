#version 450
// Rotary embedding in place, x in one storage-buffer window (rope.glsl).
#include "rope.glsl"
