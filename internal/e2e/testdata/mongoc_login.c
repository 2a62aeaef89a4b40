/*
 * mongoc_login: a libmongoc client for mongobouncer's end-to-end tests
 * (compiled by TestMongocTLS against Debian's libmongoc-dev). For each
 * argument pair NAME URI it connects with URI, pings, inserts a document
 * into test.tls_c and counts the collection with a find, and prints
 * "NAME: count N", or "NAME: error CODE MESSAGE" at the first failure
 * (the error API version 2, so a server's refusal carries the server's
 * code).
 */
#include <mongoc/mongoc.h>
#include <stdio.h>

static int run(const char *uri_string, bson_error_t *err, int64_t *count) {
	int ok = 0;
	mongoc_client_t *client = NULL;
	mongoc_collection_t *coll = NULL;
	mongoc_cursor_t *cursor = NULL;
	bson_t *ping = BCON_NEW("ping", BCON_INT32(1));
	bson_t *doc = BCON_NEW("client", BCON_UTF8("libmongoc"));
	bson_t *filter = bson_new();
	const bson_t *found;
	mongoc_uri_t *uri = mongoc_uri_new_with_error(uri_string, err);
	if (!uri) {
		goto done;
	}
	client = mongoc_client_new_from_uri_with_error(uri, err);
	if (!client) {
		goto done;
	}
	mongoc_client_set_error_api(client, MONGOC_ERROR_API_VERSION_2);
	if (!mongoc_client_command_simple(client, "admin", ping, NULL, NULL, err)) {
		goto done;
	}
	coll = mongoc_client_get_collection(client, "test", "tls_c");
	if (!mongoc_collection_insert_one(coll, doc, NULL, NULL, err)) {
		goto done;
	}
	cursor = mongoc_collection_find_with_opts(coll, filter, NULL, NULL);
	*count = 0;
	while (mongoc_cursor_next(cursor, &found)) {
		(*count)++;
	}
	ok = !mongoc_cursor_error(cursor, err);
done:
	mongoc_cursor_destroy(cursor);
	mongoc_collection_destroy(coll);
	mongoc_client_destroy(client);
	mongoc_uri_destroy(uri);
	bson_destroy(ping);
	bson_destroy(doc);
	bson_destroy(filter);
	return ok;
}

int main(int argc, char **argv) {
	mongoc_init();
	for (int i = 1; i + 1 < argc; i += 2) {
		bson_error_t err;
		int64_t count = 0;
		if (run(argv[i + 1], &err, &count)) {
			printf("%s: count %lld\n", argv[i], (long long)count);
		} else {
			printf("%s: error %u %s\n", argv[i], err.code, err.message);
		}
		fflush(stdout);
	}
	mongoc_cleanup();
	return 0;
}
