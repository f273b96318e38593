# Run at install time (install(SCRIPT)): refresh the dynamic linker's cache when
# libpagekv.so went where it looks, so programs find it without LD_LIBRARY_PATH.
# Not for a staged DESTDIR install; without the right to, say what to run.
if("$ENV{DESTDIR}" STREQUAL "" AND PKV_INSTALLED_LIB MATCHES "^(/usr/local/lib|/usr/lib|/lib)")
  find_program(PKV_LDCONFIG ldconfig PATHS /sbin /usr/sbin)
  if(PKV_LDCONFIG)
    execute_process(COMMAND ${PKV_LDCONFIG} RESULT_VARIABLE PKV_LDCONFIG_RC ERROR_QUIET)
    if(PKV_LDCONFIG_RC EQUAL 0)
      message(STATUS "pagekv: ran ldconfig (libpagekv.so in ${PKV_INSTALLED_LIB})")
    else()
      message(STATUS "pagekv: run 'sudo ldconfig' so programs find libpagekv.so in ${PKV_INSTALLED_LIB}")
    endif()
  endif()
endif()
