// Package freeaddr finds a loopback TCP port nothing listens on, for a
// server that a test, the fault harness or the benchmark is about to
// start in another process (one that cannot be handed port 0).
package freeaddr

import (
	"fmt"
	"net"
	"strconv"
)

// Port returns a TCP port free on 127.0.0.1 right now. Another process
// may take it before the caller's server binds it: a server that can
// listen on port 0 itself should.
func Port() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Loopback is Port as a host:port address.
func Loopback() (string, error) {
	port, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}
