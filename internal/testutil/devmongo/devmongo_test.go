package devmongo

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInsertFind(t *testing.T) {
	s := Start(t)
	if h, _, err := net.SplitHostPort(s.Addr()); err != nil || h != "127.0.0.1" {
		t.Fatalf("Addr() = %q: want a 127.0.0.1 address (%v)", s.Addr(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(s.URI()).SetTimeout(20 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Disconnect(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	coll := client.Database("devmongo_test").Collection("things")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 7}, {Key: "name", Value: "seven"}}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID   int    `bson:"_id"`
		Name string `bson:"name"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 7}}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.ID != 7 || got.Name != "seven" {
		t.Fatalf("found %+v, want {7 seven}", got)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 8}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("find of a missing document: %v, want ErrNoDocuments", err)
	}
}

func TestUnixSocketAndStop(t *testing.T) {
	s, err := StartMainWith(Options{UnixSocket: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.UnixSocket() == "" {
		t.Fatal("no Unix socket path")
	}
	c, err := net.DialTimeout("unix", s.UnixSocket(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := ping(s.Addr(), time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// Stopped means stopped: the port no longer answers and the state
	// directory is gone.
	if err := ping(s.Addr(), time.Now().Add(2*time.Second)); err == nil {
		t.Fatal("server still answers after Stop")
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("state dir %s still exists: %v", s.dir, err)
	}
}

func TestBinaryFromEnv(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvBinary, bin)
	got, err := Binary()
	if err != nil || got != bin {
		t.Fatalf("Binary() with %s=%s: %q, %v", EnvBinary, bin, got, err)
	}
}
