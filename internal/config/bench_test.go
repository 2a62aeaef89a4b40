package config

import (
	"os"
	"testing"
)

// Configuration is read at start-up and on reload, not per command; these
// benchmarks keep an eye on its cost anyway.

func BenchmarkParseExample(b *testing.B) {
	data, err := os.ReadFile("../../examples/mongobouncer.toml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data, "example.toml"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRoutes(b *testing.B) {
	c, err := Load("../../examples/mongobouncer.toml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Routes(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseConnString(b *testing.B) {
	const s = "mongodb://user:p%40ss@10.0.0.1:27017,10.0.0.2:27017/orders?replicaSet=rs&maxPoolSize=50&tls=true"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseConnString(s); err != nil {
			b.Fatal(err)
		}
	}
}
