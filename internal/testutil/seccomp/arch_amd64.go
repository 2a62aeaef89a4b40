//go:build linux

package seccomp

const (
	sysSeccomp = 317
	auditArch  = 0xc000003e // AUDIT_ARCH_X86_64
)
