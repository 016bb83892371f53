# ZEROD_CUDA=AUTO|ON|OFF. AUTO turns CUDA on when nvcc is found; the CPU build never needs it.
set(ZEROD_HAVE_CUDA OFF)
if(NOT ZEROD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper code plus PTX so newer devices can JIT.
      set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
    endif()
    enable_language(CUDA)
    set(ZEROD_HAVE_CUDA ON)
  elseif(ZEROD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZEROD_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA "
                        "toolkit or configure with -DZEROD_CUDA=AUTO")
  endif()
endif()
message(STATUS "zerod: CUDA ${ZEROD_HAVE_CUDA} (ZEROD_CUDA=${ZEROD_CUDA})")
