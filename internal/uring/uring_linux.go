package uring

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// io_uring ABI (include/uapi/linux/io_uring.h): only what this package uses.
const (
	sysSetup = 425
	sysEnter = 426

	offSQRing = 0
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0

	setupCoopTaskrun  = 1 << 8
	setupSingleIssuer = 1 << 12
	setupDeferTaskrun = 1 << 13

	enterGetEvents = 1 << 0

	opRead = 22
	opSend = 26
	opRecv = 27

	sqeIOLink         = 1 << 2
	sqeCQESkipSuccess = 1 << 6

	recvSendPollFirst = 1 << 0
)

type sqRingOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqRingOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqRingOffsets
	cqOff                                                                  cqRingOffsets
}

type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// Ring is one io_uring instance. It is not safe for concurrent use: one
// locked OS thread creates it and makes every call.
type Ring struct {
	fd      int
	mem     []byte
	sqeMem  []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqes    []sqe
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []cqe
	tail    uint32 // the next entry to prepare
	flushed uint32 // entries handed to the kernel
}

// New creates a ring with room for entries prepared operations (a power
// of two). The calling goroutine must be locked to its thread, and only
// that thread may use the ring.
func New(entries uint32) (*Ring, error) {
	var p params
	p.flags = setupCoopTaskrun | setupSingleIssuer | setupDeferTaskrun
	fd, _, errno := syscall.Syscall(sysSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, errno
	}
	r := &Ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		_ = syscall.Close(r.fd)
		return nil, ErrUnsupported
	}
	size := max(int(p.sqOff.array)+int(p.sqEntries)*4, int(p.cqOff.cqes)+int(p.cqEntries)*int(unsafe.Sizeof(cqe{})))
	mem, err := syscall.Mmap(r.fd, offSQRing, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		_ = syscall.Close(r.fd)
		return nil, err
	}
	sqeMem, err := syscall.Mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		_ = syscall.Munmap(mem)
		_ = syscall.Close(r.fd)
		return nil, err
	}
	r.mem, r.sqeMem = mem, sqeMem
	at := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = at(p.sqOff.head), at(p.sqOff.tail)
	r.sqMask = *at(p.sqOff.ringMask)
	array := unsafe.Slice(at(p.sqOff.array), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&sqeMem[0])), p.sqEntries)
	r.cqHead, r.cqTail = at(p.cqOff.head), at(p.cqOff.tail)
	r.cqMask = *at(p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&mem[p.cqOff.cqes])), p.cqEntries)
	r.tail = atomic.LoadUint32(r.sqTail)
	r.flushed = r.tail
	return r, nil
}

// Close releases the ring; the kernel cancels what is still in flight.
// Buffers given to operations in flight must stay allocated until then.
func (r *Ring) Close() {
	_ = syscall.Munmap(r.sqeMem)
	_ = syscall.Munmap(r.mem)
	_ = syscall.Close(r.fd)
}

// next returns a zeroed entry to prepare, submitting what is prepared
// first when the submission queue is full. An entry the kernel has not
// taken is never overwritten: while submitting fails for a passing reason
// (EBUSY, or the kernel short of memory: EAGAIN, ENOMEM), it backs off and
// tries again; any other failure is a misuse of the ring (a closed one, a
// bad buffer) and panics rather than corrupt an operation in flight.
func (r *Ring) next() *sqe {
	r.room(1)
	e := &r.sqes[r.tail&r.sqMask]
	*e = sqe{}
	r.tail++
	return e
}

// room makes room for n entries to prepare, as next says.
func (r *Ring) room(n uint32) {
	for wait := time.Microsecond; r.tail-atomic.LoadUint32(r.sqHead)+n > uint32(len(r.sqes)); {
		switch err := r.Enter(0); err {
		case nil:
		case syscall.EBUSY, syscall.EAGAIN, syscall.ENOMEM:
			time.Sleep(wait)
			wait = min(2*wait, 10*time.Millisecond)
		default:
			panic("uring: submission queue full and io_uring_enter failed: " + err.Error())
		}
	}
}

// Recv prepares a receive from the socket fd into b, completing with the
// number of bytes received, 0 at end of stream, or -errno. pollFirst
// skips the first attempt when no data is expected yet. b must stay
// allocated and untouched until the completion.
func (r *Ring) Recv(fd int, b []byte, userData uint64, pollFirst bool) {
	e := r.next()
	e.opcode = opRecv
	e.fd = int32(fd)
	if pollFirst {
		e.ioprio = recvSendPollFirst
	}
	e.addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	e.len = uint32(len(b))
	e.userData = userData
}

// Read prepares a read from fd (a pipe or an eventfd) into b.
func (r *Ring) Read(fd int, b []byte, userData uint64) {
	e := r.next()
	e.opcode = opRead
	e.fd = int32(fd)
	e.addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	e.len = uint32(len(b))
	e.off = ^uint64(0) // the current position: pipes have none
	e.userData = userData
}

// Send prepares a send of all of b to the socket fd (MSG_WAITALL). With
// link, the operation prepared next starts only after this one completed
// in full. b must stay allocated and untouched until the completion.
func (r *Ring) Send(fd int, b []byte, userData uint64, link bool) {
	e := r.next()
	e.opcode = opSend
	if link {
		e.flags = sqeIOLink
	}
	e.fd = int32(fd)
	e.addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	e.len = uint32(len(b))
	e.opFlags = syscall.MSG_WAITALL | syscall.MSG_NOSIGNAL
	e.userData = userData
}

// SendThenRecv prepares a send of all of out to the socket fd, linked to a
// receive from it into in: the receive starts once out is sent in full.
// Exactly one of the two completes: the receive, when the send was whole
// (the send is IOSQE_CQE_SKIP_SUCCESS, so the common case costs one
// completion and one wake-up), or the send, with its error or short
// count, when it was not; the kernel then cancels the receive without a
// completion. Both are submitted together (a link cannot span two
// submissions). out and in must stay allocated and untouched until that
// completion.
func (r *Ring) SendThenRecv(fd int, out []byte, sendData uint64, in []byte, recvData uint64) {
	r.room(2)
	r.Send(fd, out, sendData, true)
	r.sqes[(r.tail-1)&r.sqMask].flags |= sqeCQESkipSuccess
	r.Recv(fd, in, recvData, true)
}

// Enter submits what is prepared and waits until at least wait operations
// have completed; with DEFER_TASKRUN, completions are produced only here.
func (r *Ring) Enter(wait uint32) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	for {
		n := r.tail - r.flushed
		done, _, errno := syscall.Syscall6(sysEnter, uintptr(r.fd), uintptr(n), uintptr(wait), enterGetEvents, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		r.flushed += uint32(done)
		return nil
	}
}

// Completions calls fn for each completion produced, in order, and
// consumes them. fn may prepare new operations.
func (r *Ring) Completions(fn func(userData uint64, res int32)) {
	head := atomic.LoadUint32(r.cqHead)
	for {
		tail := atomic.LoadUint32(r.cqTail)
		if head == tail {
			break
		}
		for ; head != tail; head++ {
			c := r.cqes[head&r.cqMask]
			atomic.StoreUint32(r.cqHead, head+1)
			fn(c.userData, c.res)
		}
	}
}

// Produced reports whether completions are produced and not yet consumed.
func (r *Ring) Produced() bool {
	return atomic.LoadUint32(r.cqTail) != atomic.LoadUint32(r.cqHead)
}

// Supported reports whether a Ring can be created here: the kernel may be
// too old, io_uring disabled (kernel.io_uring_disabled), or refused by a
// seccomp profile, as container runtimes' defaults do.
func Supported() bool {
	ch := make(chan bool)
	go func() {
		runtime.LockOSThread() // the ring is made and dropped on this thread
		defer runtime.UnlockOSThread()
		r, err := New(2)
		if err == nil {
			r.Close()
		}
		ch <- err == nil
	}()
	return <-ch
}
