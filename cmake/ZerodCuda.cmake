# ZEROD_CUDA=AUTO|ON|OFF. AUTO turns CUDA on when nvcc is found; the CPU build never needs it.
set(ZEROD_HAVE_CUDA OFF)
# Sanitizer builds check the host code; device code would only slow them down.
if(ZEROD_SANITIZE AND ZEROD_CUDA STREQUAL "AUTO")
  message(STATUS "zerod: CUDA skipped in a sanitizer build (ZEROD_CUDA=ON forces it)")
elseif(NOT ZEROD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper code plus PTX so newer devices can JIT.
      set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows nvcc's C++17 flags, not C++20's; the .cu files need no more.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    # NCCL ships with the toolkit here (lib/ and include/ beside cudart).
    find_library(ZEROD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
                 ${CUDAToolkit_TARGET_DIR}/lib)
    find_path(ZEROD_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT ZEROD_NCCL_LIBRARY OR NOT ZEROD_NCCL_INCLUDE)
      message(FATAL_ERROR "CUDA found but NCCL (libnccl, nccl.h) was not; configure with -DZEROD_CUDA=OFF")
    endif()
    add_library(ZerodNccl INTERFACE)
    target_link_libraries(ZerodNccl INTERFACE ${ZEROD_NCCL_LIBRARY} CUDA::cudart)
    target_include_directories(ZerodNccl INTERFACE ${ZEROD_NCCL_INCLUDE})
    set(ZEROD_HAVE_CUDA ON)
  elseif(ZEROD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZEROD_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA "
                        "toolkit or configure with -DZEROD_CUDA=AUTO")
  endif()
endif()
message(STATUS "zerod: CUDA ${ZEROD_HAVE_CUDA} (ZEROD_CUDA=${ZEROD_CUDA})")
