//go:build linux

package seccomp

const (
	sysSeccomp = 277
	auditArch  = 0xc00000b7 // AUDIT_ARCH_AARCH64
)
