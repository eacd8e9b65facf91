-- The classic Service Broker pattern: a state table keyed by conversation group, read
-- after GET CONVERSATION GROUP and written in the same transaction as RECEIVE and SEND.
CREATE MESSAGE TYPE [//shop/Item] VALIDATION = NONE;
CREATE MESSAGE TYPE [//shop/Total] VALIDATION = NONE;
CREATE CONTRACT [//shop/Order] ([//shop/Item] SENT BY INITIATOR, [//shop/Total] SENT BY TARGET);
CREATE QUEUE OrderQueue;
CREATE QUEUE ShopperQueue;
CREATE SERVICE [//shop/Orders] ON QUEUE OrderQueue ([//shop/Order]);
CREATE SERVICE [//shop/Shopper] ON QUEUE ShopperQueue;
GO

CREATE TABLE dbo.OrderState (
    conversation_group_id UNIQUEIDENTIFIER NOT NULL PRIMARY KEY,
    items INT NOT NULL DEFAULT 0,
    total INT NOT NULL DEFAULT 0
);
GO

DECLARE @h UNIQUEIDENTIFIER;
BEGIN DIALOG CONVERSATION @h
    FROM SERVICE [//shop/Shopper] TO SERVICE '//shop/Orders'
    ON CONTRACT [//shop/Order] WITH ENCRYPTION = OFF;
SEND ON CONVERSATION @h MESSAGE TYPE [//shop/Item] (N'12');
SEND ON CONVERSATION @h MESSAGE TYPE [//shop/Item] (N'30');
GO

DECLARE @g UNIQUEIDENTIFIER, @handle UNIQUEIDENTIFIER, @body NVARCHAR(100),
    @items INT, @total INT;
WHILE 1 = 1
BEGIN
    BEGIN TRANSACTION;
    WAITFOR (GET CONVERSATION GROUP @g FROM OrderQueue), TIMEOUT 1000;
    IF @g IS NULL
    BEGIN
        ROLLBACK TRANSACTION;
        BREAK;
    END
    SET @items = NULL;
    SELECT @items = items, @total = total FROM OrderState WHERE conversation_group_id = @g;
    IF @items IS NULL
    BEGIN
        INSERT INTO OrderState (conversation_group_id) VALUES (@g);
        SELECT @items = 0, @total = 0;
    END
    RECEIVE TOP (1) @handle = conversation_handle, @body = CAST(message_body AS NVARCHAR(100))
        FROM OrderQueue WHERE conversation_group_id = @g;
    SET @items = @items + 1;
    SET @total = @total + CAST(@body AS INT);
    UPDATE OrderState SET items = @items, total = @total WHERE conversation_group_id = @g;
    SEND ON CONVERSATION @handle MESSAGE TYPE [//shop/Total] (CAST(@total AS NVARCHAR(20)));
    COMMIT TRANSACTION;
END
GO

SELECT items, total FROM OrderState;
GO
