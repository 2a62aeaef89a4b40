package main

// The hash-password subcommand: the auth_file line for one user, from a
// password read on stdin, so that the file need not hold plain passwords.

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// maxPasswordLen bounds the password line read.
const maxPasswordLen = 4096

// hashPassword runs `mongobouncer hash-password --user U --db D`: it reads
// one line (the password) from stdin and prints the auth_file line with
// both SCRAM forms, each with a fresh random salt. It returns the exit
// code.
func hashPassword(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mongobouncer hash-password", flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := fs.String("user", "", "user `name`")
	db := fs.String("db", "admin", "the user's authentication `database`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n  mongobouncer hash-password --user NAME [--db admin] < password\n\nReads the password (one line) on stdin and prints the auth_file line for the user,\nwith SCRAM-SHA-256 and SCRAM-SHA-1 secrets.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *user == "" || *db == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "mongobouncer hash-password: give --user (and --db, admin by default), and the password on stdin")
		return 2
	}
	r := bufio.NewReaderSize(io.LimitReader(stdin, maxPasswordLen+2), maxPasswordLen+2)
	line, err := r.ReadString('\n')
	if err != nil && err != io.EOF {
		fmt.Fprintf(stderr, "mongobouncer hash-password: reading the password: %v\n", err)
		return 1
	}
	if len(line) > maxPasswordLen+1 || len(line) > maxPasswordLen && !strings.HasSuffix(line, "\n") {
		fmt.Fprintf(stderr, "mongobouncer hash-password: the password is longer than %d bytes\n", maxPasswordLen)
		return 1
	}
	password := strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if password == "" {
		fmt.Fprintln(stderr, "mongobouncer hash-password: empty password: write it on stdin, one line")
		return 1
	}
	out, err := auth.HashPassword(*user, *db, password)
	if err != nil {
		fmt.Fprintf(stderr, "mongobouncer hash-password: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, out)
	return 0
}
