package testio

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal: term is the terminal a program under test writes to
// (give it as the program's stderr), reader reads what it wrote, with the terminal's own
// line endings ("\r\n"). Close both when done; reader fails with EIO once every copy of
// term is closed.
func OpenPTY() (term, reader *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	raw, err := m.SyscallConn()
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	var n int
	var ioctlErr error
	err = raw.Control(func(fd uintptr) {
		if ioctlErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioctlErr == nil {
			n, ioctlErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock the pseudo-terminal: %w", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("open the terminal side: %w", err)
	}
	return s, m, nil
}
