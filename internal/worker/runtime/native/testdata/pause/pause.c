// The smallest function an entrypoint can be, for BenchmarkChurn's
// "minimal" rows: a static program with no C library that waits for a
// signal. It measures the runtime's own creation rate without a language
// runtime's start (a Go program's costs 1.1 ms of CPU here, mostly the
// CPUID instructions of its feature detection on this virtual CPU).
// Built by TestMain with the flags of scripts/build-sandbox-init.sh.
__asm__(".text\n.global _start\n_start:\n"
        "1: mov $34, %eax\n syscall\n jmp 1b\n");  // pause(), forever
