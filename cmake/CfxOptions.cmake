# Resolve CFX_WITH_* (AUTO/ON/OFF) into CFX_HAVE_* and the libraries the
# optional parts need, three ways:
#  CFX_EXTRA_LIBS      to link in this build tree (absolute paths);
#  CFX_INSTALL_LIBS    what an installed conflux::conflux_static needs, by
#                      library name or by an imported target that
#                      conflux-config.cmake finds again (no absolute paths);
#  CFX_PC_LIBS_PRIVATE the same for conflux.pc (Libs.private), with
#                      CFX_PC_VARIABLES defining the directories it uses.
set(CFX_EXTRA_LIBS "")
set(CFX_INSTALL_LIBS "")
set(CFX_PC_LIBS_PRIVATE "")
set(CFX_PC_VARIABLES "")

function(cfx_check_option opt)
  string(TOUPPER "${${opt}}" v)
  if(NOT v MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF (got '${${opt}}')")
  endif()
  set(${opt} ${v} PARENT_SCOPE)
endfunction()

cfx_check_option(CFX_WITH_VERBS)
cfx_check_option(CFX_WITH_DPDK)
cfx_check_option(CFX_WITH_CUDA)

# RDMA verbs: libibverbs + librdmacm (rdma-core).
set(CFX_HAVE_VERBS OFF)
if(NOT CFX_WITH_VERBS STREQUAL "OFF")
  find_library(CFX_IBVERBS_LIB ibverbs)
  find_library(CFX_RDMACM_LIB rdmacm)
  find_path(CFX_IBVERBS_INC infiniband/verbs.h)
  find_path(CFX_RDMACM_INC rdma/rdma_cma.h)
  if(CFX_IBVERBS_LIB AND CFX_RDMACM_LIB AND CFX_IBVERBS_INC AND CFX_RDMACM_INC
     AND EXISTS ${PROJECT_SOURCE_DIR}/dataplane/verbs)
    set(CFX_HAVE_VERBS ON)
    list(APPEND CFX_EXTRA_LIBS ${CFX_IBVERBS_LIB} ${CFX_RDMACM_LIB})
    list(APPEND CFX_INSTALL_LIBS ibverbs rdmacm)
    string(APPEND CFX_PC_LIBS_PRIVATE " -lrdmacm -libverbs")
  elseif(CFX_WITH_VERBS STREQUAL "ON")
    message(FATAL_ERROR "CFX_WITH_VERBS=ON but libibverbs/librdmacm (or the verbs transport sources) were not found: apt-get install libibverbs-dev librdmacm-dev")
  endif()
endif()

# DPDK via pkg-config.
set(CFX_HAVE_DPDK OFF)
if(NOT CFX_WITH_DPDK STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(CFX_DPDK QUIET libdpdk)
  endif()
  if(CFX_DPDK_FOUND AND EXISTS ${PROJECT_SOURCE_DIR}/dataplane/dpdk)
    set(CFX_HAVE_DPDK ON)
    # Only the libraries dataplane/dpdk/dpdk_io.c calls: the drivers
    # (net_memif, net_af_packet, ...) are plugins EAL loads at run time.
    set(CFX_DPDK_LIBS "")
    foreach(l rte_ethdev rte_mbuf rte_mempool rte_eal)
      find_library(CFX_DPDK_LIB_${l} ${l} HINTS ${CFX_DPDK_LIBRARY_DIRS} REQUIRED)
      list(APPEND CFX_DPDK_LIBS ${CFX_DPDK_LIB_${l}})
      list(APPEND CFX_INSTALL_LIBS ${l})
      string(APPEND CFX_PC_LIBS_PRIVATE " -l${l}")
    endforeach()
    list(APPEND CFX_EXTRA_LIBS ${CFX_DPDK_LIBS})
  elseif(CFX_WITH_DPDK STREQUAL "ON")
    message(FATAL_ERROR "CFX_WITH_DPDK=ON but libdpdk (or the dpdk transport sources) were not found: apt-get install dpdk-dev")
  endif()
endif()

# CUDA toolkit: the CUDA memory type, device reduction kernels and
# GPUDirect registration (gpu/cuda/).  The runtime is linked statically and
# finds the driver (libcuda.so.1) at first use, so the library still loads
# and runs on hosts without one; nothing links libcuda directly.
set(CFX_HAVE_CUDA OFF)
set(CFX_CUDA_ARCHITECTURES "90-real;80-virtual" CACHE STRING
    "CUDA architectures: SASS for sm_90 (H100/H200), PTX that JITs on sm_80 and later")
if(NOT CFX_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND EXISTS ${PROJECT_SOURCE_DIR}/gpu/cuda)
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER AND EXISTS ${PROJECT_SOURCE_DIR}/gpu/cuda)
    set(CFX_HAVE_CUDA ON)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${CFX_CUDA_ARCHITECTURES})
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_RUNTIME_LIBRARY None) # cudart_static is linked below, once
    enable_language(CUDA)
    # By path in this tree.  An installed conflux::conflux_static links
    # CUDA::cudart_static instead, which conflux-config.cmake finds again on
    # the user's machine; libconflux.so carries the runtime inside.  The
    # runtime is C++: a static link also needs libstdc++.
    find_library(CFX_CUDART_STATIC_LIB cudart_static HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
    list(APPEND CFX_EXTRA_LIBS ${CFX_CUDART_STATIC_LIB} ${CMAKE_DL_LIBS} rt)
    list(APPEND CFX_INSTALL_LIBS CUDA::cudart_static stdc++)
    get_filename_component(CFX_CUDART_DIR ${CFX_CUDART_STATIC_LIB} DIRECTORY)
    # A directory outside our prefix: override it with
    # pkg-config --define-variable=cudalibdir=DIR where CUDA lives elsewhere.
    string(APPEND CFX_PC_VARIABLES "cudalibdir=${CFX_CUDART_DIR}\n")
    string(APPEND CFX_PC_LIBS_PRIVATE " -L\${cudalibdir} -lcudart_static -ldl -lrt -lstdc++")
  elseif(CFX_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CFX_WITH_CUDA=ON but the CUDA toolkit, a working nvcc (or the gpu/cuda sources) was not found: install the CUDA toolkit under /usr/local/cuda")
  endif()
endif()
