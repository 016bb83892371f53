#ifndef ZEROD_RUNTIME_COMMON_CPU_FEATURES_H_
#define ZEROD_RUNTIME_COMMON_CPU_FEATURES_H_

// CPU features that __builtin_cpu_supports cannot name on every compiler we build with: clang 14
// rejects "f16c" (GCC accepts it).

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace zerod {

// F16C (VCVTPH2PS / VCVTPS2PH), usable only when the OS saves the YMM state, as GCC checks it.
inline bool CpuHasF16c() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  if ((ecx & bit_OSXSAVE) == 0 || (ecx & bit_F16C) == 0) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 0x6) == 0x6;  // XMM and YMM state
#else
  return false;
#endif
}

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_CPU_FEATURES_H_
