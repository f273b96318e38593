# Compile src/device/vulkan/shaders/*.comp to SPIR-V with glslc at build time and
# embed every module in one generated C file (pkv_shaders.c) that defines
#   const pkv_spirv pkv_vk_shaders[]; const int pkv_vk_shader_count;
# with each entry's name being the .comp file name without extension.
function(pkv_embed_shaders target)
  file(GLOB comps CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/device/vulkan/shaders/*.comp)
  set(spvs "")
  foreach(comp ${comps})
    get_filename_component(n ${comp} NAME_WE)
    set(spv ${CMAKE_BINARY_DIR}/shaders/${n}.spv)
    add_custom_command(OUTPUT ${spv}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/shaders
      COMMAND ${GLSLC} --target-env=vulkan1.1 -O -I${PROJECT_SOURCE_DIR}/src/device/vulkan/shaders
              -o ${spv} ${comp}
      DEPENDS ${comp} ${PROJECT_SOURCE_DIR}/src/device/vulkan/shaders ${PROJECT_SOURCE_DIR}/src/base/iq-grids.h
      IMPLICIT_DEPENDS C ${comp}
      COMMENT "glslc ${n}.comp")
    list(APPEND spvs ${spv})
  endforeach()
  set(out ${CMAKE_BINARY_DIR}/shaders/pkv_shaders.c)
  # A ';' inside one COMMAND argument would be split by the generator: pass the
  # list '|'-separated (embed.cmake splits it back).
  string(REPLACE ";" "|" spvs_arg "${spvs}")
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} "-DSPVS=${spvs_arg}" -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${spvs} ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    COMMENT "embedding SPIR-V shaders" VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
